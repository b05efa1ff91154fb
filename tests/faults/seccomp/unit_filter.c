/* The part of deploy/bide.service's sandbox that bide's own set-up could trip over, as a
 * seccomp filter: chown in every form fails with EPERM (SystemCallFilter=~@privileged,
 * SystemCallErrorNumber=EPERM), and so does a chmod that sets a setuid or setgid bit
 * (RestrictSUIDSGID=yes). Then it execs its arguments. x86_64 only; the test skips elsewhere.
 * Built by tests/faults/test_unit.py into the test's temporary directory. */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARG(n) (offsetof(struct seccomp_data, args) + (n) * 8)
#define DENY BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA))
#define ALLOW BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

int main(int argc, char **argv) {
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_chown, 11, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fchown, 10, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_lchown, 9, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fchownat, 8, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_chmod, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fchmod, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fchmodat, 2, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG(1)), /* chmod, fchmod: the mode */
        BPF_JUMP(BPF_JMP | BPF_JA, 1, 0, 0),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG(2)), /* fchmodat: the mode */
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 06000, 1, 0),
        ALLOW,
        DENY,
    };
    struct sock_fprog prog = {.len = sizeof(code) / sizeof(code[0]), .filter = code};
    if (argc < 2) {
        fprintf(stderr, "usage: unit_filter COMMAND [ARG...]\n");
        return 2;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("unit_filter: installing the seccomp filter");
        return 2;
    }
    execvp(argv[1], argv + 1);
    perror("unit_filter: exec");
    return 127;
}
