"""The seccomp filter the bubblewrap backend installs: no kernel keyrings, no io_uring and
no userfaultfd in a sandbox.

Namespaces do not separate keyrings. A process inherits its parent's session keyring,
and bubblewrap's ``--new-session`` is ``setsid``, not a new keyring: a sandboxed command
could find and read every key lodger's session holds (``request_key`` then ``keyctl
read``; Kerberos tickets, keys a login or a secret service put there). Docker and
Flatpak refuse these system calls for the same reason, and so does this filter:
``add_key``, ``request_key`` and ``keyctl`` fail with ENOSYS, as on a kernel without
keyrings, which programs that use them already handle.

The same filter refuses two interfaces a command has no need for and kernel exploits
reach for first: io_uring (``io_uring_setup``, ``_enter``, ``_register``; a large attack
surface of its own, refused by Docker's and ChromeOS's default profiles and by Android),
and ``userfaultfd`` (pauses the kernel on a page fault, the usual way to widen a race).
Programs fall back on ENOSYS: io_uring users to ordinary system calls. Every other call is
allowed.

The filter is classic BPF over ``struct seccomp_data`` (``nr`` at offset 0, ``arch`` at
4), one block per ABI a process on this machine can use: an x86-64 process may also
make i386 (``int 0x80``) and x32 calls, an arm64 one arm calls.
"""

from __future__ import annotations

import errno
import struct

__all__ = ["KEYRING_SYSCALLS", "REFUSED_SYSCALLS", "refusal_filter"]

# <linux/audit.h>
_AUDIT_ARCH = {"x86_64": 0xC000003E, "i386": 0x40000003, "aarch64": 0xC00000B7, "arm": 0x40000028}
#: add_key, request_key and keyctl in each ABI's system call table
KEYRING_SYSCALLS: dict[str, tuple[int, ...]] = {
    "x86_64": (248, 249, 250),  # x32 uses the same numbers with bit 30 set
    "i386": (286, 287, 288),
    "aarch64": (217, 218, 219),
    "arm": (309, 310, 311),
}
#: io_uring_setup, io_uring_enter and io_uring_register: one number in every ABI
IO_URING_SYSCALLS = (425, 426, 427)
#: userfaultfd in each ABI's table
_USERFAULTFD = {"x86_64": 323, "i386": 374, "aarch64": 282, "arm": 388}
#: every call the filter refuses, per ABI
REFUSED_SYSCALLS: dict[str, tuple[int, ...]] = {
    abi: (*numbers, _USERFAULTFD[abi], *IO_URING_SYSCALLS)
    for abi, numbers in KEYRING_SYSCALLS.items()
}
_X32_BIT = 0x40000000

# <linux/bpf_common.h>, <linux/seccomp.h>
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_AND_K = 0x54
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_NR, _ARCH = 0, 4


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def refusal_filter() -> bytes:
    """The BPF program (``struct sock_filter[]``, native byte order) for ``bwrap
    --seccomp FD``."""
    deny = _insn(_RET_K, _RET_ERRNO | errno.ENOSYS)
    allow = _insn(_RET_K, _RET_ALLOW)
    program = [_insn(_LD_W_ABS, _ARCH)]
    for abi, numbers in REFUSED_SYSCALLS.items():
        # arch == abi: load nr (x86-64: without the x32 bit), test each number, allow.
        block = [_insn(_LD_W_ABS, _NR)]
        if abi == "x86_64":
            block.append(_insn(_AND_K, ~_X32_BIT & 0xFFFFFFFF))
        tests = len(numbers)
        for i, number in enumerate(numbers):
            # Equal: jump over the remaining tests and the allow, onto the deny.
            block.append(_insn(_JEQ_K, number, jt=tests - i, jf=0))
        block += [allow, deny]
        program.append(_insn(_JEQ_K, _AUDIT_ARCH[abi], jt=0, jf=len(block)))
        program += block
    program.append(allow)  # an ABI this machine cannot run: nothing to refuse
    return b"".join(program)
