# What the Python benchmarks read of a process and ask of the kernel: /proc figures, and the page cache dropped between ways.
import os


def proc_figures(pid):
    """(cpu seconds, peak RSS bytes, bytes written to storage, private resident bytes) of a process.

    The daemon's peak RSS counts the ranks' arenas it maps (shared pages are resident in both);
    its private (anonymous) memory is what it holds of its own: staging, plans, buffers."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    hwm = anon = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
            elif line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
    wrote = 0
    with open("/proc/%d/io" % pid) as f:
        for line in f:
            if line.startswith("write_bytes:"):
                wrote = int(line.split()[1])
    return cpu, hwm, wrote, anon


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False
