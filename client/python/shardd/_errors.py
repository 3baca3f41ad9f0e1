# ShardError and the binding's checks of plain arguments: libshardd's error codes as exceptions, text, sizes.
import re

from . import _lib

class ShardError(Exception):
    """A libshardd call failed.

    code: the negative SHARDD_E_* number; name: its stable wire name ("gap",
    "exists", ...); message: what libshardd or the daemon said, naming the
    field, tensor or file at fault.
    """

    def __init__(self, code, name, message):
        super().__init__(code, name, message)
        self.code = code
        self.name = name
        self.message = message

    def __str__(self):
        return "%s: %s" % (self.name, self.message)


def _text(b):
    return b.decode("utf-8", "replace") if b else ""


def error_names():
    """{code: name} for every error code this libshardd knows."""
    lib = _lib.lib()
    out = {}
    code = -1
    # The table only grows and stays dense, so walk it until it runs out.
    while True:
        name = _text(lib.shardd_err_name(code))
        if name == "unknown":
            return out
        out[code] = name
        code -= 1


def _error(code, raw):
    lib = _lib.lib()
    name = _text(lib.shardd_err_name(code))
    msg = _text(raw)
    # libshardd formats "<wire code>: <message>"; keep the two apart.
    if msg.startswith(name + ": "):
        msg = msg[len(name) + 2:]
    if not msg:
        msg = _text(lib.shardd_strerror(code))
    return ShardError(code, name, msg)


def refusal(name, message):
    """A ShardError raised by the binding itself, with the code libshardd gives the wire name `name`."""
    codes = {n: c for c, n in error_names().items()}
    return ShardError(codes[name], name, message)


def _bytes(s, what):
    if isinstance(s, bytes):
        return s
    if not isinstance(s, str):
        raise TypeError("%s must be str, not %s" % (what, type(s).__name__))
    return s.encode("utf-8")


# huggingface_hub's units: decimal KB..TB and binary KiB..TiB, either case.
_SIZE_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([KMGTkmgt][iI]?[bB])\s*\Z")


def parse_size(size):
    """Bytes of max_shard_size: an int, or a string as save_pretrained takes it ("5GB" is
    5*10**9, "500MiB" 500*2**20; a fractional number is allowed, "1.5GB"); None and 0 mean
    the default."""
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise TypeError("max_shard_size must be an int or a string like '5GB', not %s"
                        % type(size).__name__)
    if isinstance(size, int):
        value = size
    else:
        m = _SIZE.match(size)
        if not m:
            raise ValueError("max_shard_size %r is not a number of bytes followed by KB, MB, GB, TB, "
                             "KiB, MiB, GiB or TiB" % (size,))
        value = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])
    if value < 0 or value >= 2**64:
        raise ValueError("max_shard_size %r must be between 0 (the default, 5GB) and 2**64 - 1 bytes"
                         % (size,))
    return value
