#!/usr/bin/env python3
"""A userspace delaying link for the end-to-end tests (this kernel has no
sch_netem): forwards every Ethernet frame between two interfaces, each one
DELAY seconds after it arrived, in order, in both directions.

    delay_forwarder.py --offload-off IFACE...   # software checksums, no TSO/GSO
    delay_forwarder.py --forward A B --delay 0.6

Frames read from a packet socket carry what the sender's offloads left
undone (a partial checksum, a 64 KiB TSO segment), so every interface whose
traffic crosses the forwarder must have checksum offload and TSO off first.
"""
import argparse
import collections
import ctypes
import fcntl
import socket
import struct
import sys
import threading
import time

SIOCETHTOOL = 0x8946
ETHTOOL_STXCSUM = 0x17
ETHTOOL_SSG = 0x19
ETHTOOL_STSO = 0x1F
ETHTOOL_SGSO = 0x24
ETHTOOL_SRXCSUM = 0x15
PACKET_OUTGOING = 4


def ethtool_set(iface, cmd, value):
    val = ctypes.create_string_buffer(struct.pack("II", cmd, value))
    ifr = struct.pack("16sP", iface.encode(), ctypes.addressof(val)) + b"\0" * 16
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCETHTOOL, ifr)


def offload_off(iface):
    for cmd in (ETHTOOL_STSO, ETHTOOL_SGSO, ETHTOOL_SSG, ETHTOOL_STXCSUM, ETHTOOL_SRXCSUM):
        try:
            ethtool_set(iface, cmd, 0)
        except OSError as e:
            print(f"ethtool {cmd:#x} on {iface}: {e}", file=sys.stderr, flush=True)


def open_raw(iface):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((iface, 0))
    return s


def pump(src, dst, delay, name):
    queue = collections.deque()
    cv = threading.Condition()

    def reader():
        while True:
            frame, addr = src.recvfrom(65535)
            if addr[2] == PACKET_OUTGOING:
                continue
            with cv:
                queue.append((time.monotonic() + delay, frame))
                cv.notify()

    def writer():
        while True:
            with cv:
                while not queue:
                    cv.wait()
                due, frame = queue[0]
                now = time.monotonic()
                if due > now:
                    cv.wait(due - now)
                    continue
                queue.popleft()
            try:
                dst.send(frame)
            except OSError as e:
                print(f"{name}: send {len(frame)} bytes: {e}", file=sys.stderr, flush=True)

    threading.Thread(target=reader, daemon=True).start()
    threading.Thread(target=writer, daemon=True).start()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--offload-off", nargs="*", default=[])
    p.add_argument("--forward", nargs=2)
    p.add_argument("--delay", type=float, default=0.0)
    a = p.parse_args()
    for iface in a.offload_off:
        offload_off(iface)
    if not a.forward:
        return
    x, y = a.forward
    sx, sy = open_raw(x), open_raw(y)
    pump(sx, sy, a.delay, f"{x}->{y}")
    pump(sy, sx, a.delay, f"{y}->{x}")
    print(f"forwarding {x} <-> {y} with {a.delay:.3f} s one way", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
