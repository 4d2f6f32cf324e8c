# A parent with a 32 MiB heap forks four writers, each writing its own quarter (COW).
import os
b = bytearray(32 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
q = len(b) // 4
kids = []
for k in range(4):
    pid = os.fork()
    if pid == 0:
        for i in range(k * q, (k + 1) * q, 4096):
            b[i] = 2 + k
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
