/*
 * clockshift: run a program with its wall clock moved by an offset that a file holds.
 *
 *   clockshift OFFSET_FILE PROGRAM [ARG...]
 *
 * The file holds seconds ("+2", "-0.5", "30", "0"); it is read again at most every 20 ms, so
 * a test can skew or step the clock of a running process by replacing the file. Only
 * CLOCK_REALTIME (and gettimeofday) move; the monotonic clock stays true, as under a bad NTP
 * step.
 *
 * Why not libfaketime: nats-server is a statically linked Go program that reads the clock
 * through the kernel's vDSO, so a preload library never sees a clock reading. clockshift
 * instead hides the vDSO from the program (it rewrites AT_SYSINFO_EHDR in the auxiliary
 * vector at exec), so Go falls back to the clock_gettime system call, and a seccomp filter
 * stops only the wall clock calls at this tracer, which answers them itself. Every other
 * system call runs untouched.
 *
 * The tracer forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the program,
 * kills it when the tracer dies (PTRACE_O_EXITKILL) and exits with its exit status. x86-64
 * Linux only.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REREAD_NS 20000000LL
#define SEEN_SLOTS 16384

static pid_t program;
static const char *offset_path;
static int64_t offset_ns;
static int64_t last_read_ns = -REREAD_NS;
static pid_t seen[SEEN_SLOTS];

static int64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void read_offset(void) {
    int64_t mono = now_ns(CLOCK_MONOTONIC);
    if (mono - last_read_ns < REREAD_NS) return;
    last_read_ns = mono;
    FILE *f = fopen(offset_path, "r");
    if (!f) return; /* keep the last offset while the file is being replaced */
    char text[64] = {0};
    if (fgets(text, sizeof text - 1, f)) {
        char *end;
        double seconds = strtod(text, &end);
        if (end != text) offset_ns = (int64_t)(seconds * 1e9);
    }
    fclose(f);
}

/* Only the first stop of each new thread is its start-up SIGSTOP, which must not reach it. */
static int first_stop(pid_t tid) {
    unsigned slot = (unsigned)tid % SEEN_SLOTS;
    for (unsigned probes = 0; probes < SEEN_SLOTS; probes++) {
        if (seen[slot] == tid) return 0;
        if (seen[slot] == 0) {
            seen[slot] = tid;
            return 1;
        }
        slot = (slot + 1) % SEEN_SLOTS;
    }
    return 0;
}

static void forget(pid_t tid) {
    unsigned slot = (unsigned)tid % SEEN_SLOTS;
    for (unsigned probes = 0; probes < SEEN_SLOTS && seen[slot]; probes++) {
        /* A tombstone keeps later entries of the same probe chain reachable. */
        if (seen[slot] == tid) {
            seen[slot] = -1;
            return;
        }
        slot = (slot + 1) % SEEN_SLOTS;
    }
}

static void forward(int sig) {
    if (program > 0) kill(program, sig);
}

static int write_words(pid_t tid, unsigned long addr, const int64_t *words, int n) {
    struct iovec local = {(void *)words, (size_t)n * sizeof *words};
    struct iovec remote = {(void *)addr, (size_t)n * sizeof *words};
    if (process_vm_writev(tid, &local, 1, &remote, 1, 0) == (ssize_t)local.iov_len) return 0;
    for (int i = 0; i < n; i++)
        if (ptrace(PTRACE_POKEDATA, tid, (void *)(addr + 8 * i), (void *)words[i]) < 0) return -1;
    return 0;
}

/* Answer a stopped wall clock call with shifted time and skip the real one. */
static void answer_clock(pid_t tid) {
    struct user_regs_struct regs;
    if (ptrace(PTRACE_GETREGS, tid, 0, &regs) < 0) return;
    read_offset();
    int64_t t = now_ns(CLOCK_REALTIME) + offset_ns;
    int64_t words[2] = {t / 1000000000LL, t % 1000000000LL};
    if (words[1] < 0) {
        words[0] -= 1;
        words[1] += 1000000000LL;
    }
    unsigned long addr;
    if (regs.orig_rax == __NR_clock_gettime) {
        addr = regs.rsi;
    } else {
        addr = regs.rdi;
        words[1] /= 1000; /* struct timeval holds microseconds */
    }
    long result = 0;
    if (addr != 0 && write_words(tid, addr, words, 2) < 0) result = -EFAULT;
    regs.orig_rax = (unsigned long long)-1; /* skip the system call, return rax */
    regs.rax = (unsigned long long)result;
    ptrace(PTRACE_SETREGS, tid, 0, &regs);
}

/* At exec, turn the vDSO's auxiliary vector entry into AT_IGNORE. */
static void hide_vdso(pid_t tid) {
    struct user_regs_struct regs;
    if (ptrace(PTRACE_GETREGS, tid, 0, &regs) < 0) return;
    unsigned long p = regs.rsp;
    errno = 0;
    long argc = ptrace(PTRACE_PEEKDATA, tid, (void *)p, 0);
    p += 8 * (unsigned long)(argc + 2); /* argc, argv[], NULL */
    while (ptrace(PTRACE_PEEKDATA, tid, (void *)p, 0) != 0) p += 8; /* envp[] */
    p += 8;
    for (;;) {
        long type = ptrace(PTRACE_PEEKDATA, tid, (void *)p, 0);
        if (type == AT_NULL || errno) break;
        if (type == AT_SYSINFO_EHDR) ptrace(PTRACE_POKEDATA, tid, (void *)p, (void *)AT_IGNORE);
        p += 16;
    }
}

static void install_filter(void) {
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clock_gettime, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CLOCK_REALTIME, 2, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_gettimeofday, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof code / sizeof code[0], code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0) {
        perror("clockshift: seccomp");
        _exit(126);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: clockshift OFFSET_FILE PROGRAM [ARG...]\n");
        return 2;
    }
    offset_path = argv[1];
    read_offset();
    program = fork();
    if (program < 0) {
        perror("clockshift: fork");
        return 1;
    }
    if (program == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        ptrace(PTRACE_TRACEME, 0, 0, 0);
        raise(SIGSTOP); /* the tracer sets its options before the filter can stop us */
        install_filter();
        execvp(argv[2], argv + 2);
        perror("clockshift: exec");
        _exit(127);
    }
    int status;
    if (waitpid(program, &status, 0) < 0 || !WIFSTOPPED(status)) return 1;
    seen[(unsigned)program % SEEN_SLOTS] = program;
    long options = PTRACE_O_TRACESECCOMP | PTRACE_O_TRACECLONE | PTRACE_O_TRACEFORK |
                   PTRACE_O_TRACEVFORK | PTRACE_O_TRACEEXEC | PTRACE_O_EXITKILL;
    if (ptrace(PTRACE_SETOPTIONS, program, 0, options) < 0) {
        perror("clockshift: ptrace");
        kill(program, SIGKILL);
        return 1;
    }
    int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++) {
        struct sigaction action = {0};
        action.sa_handler = forward;
        sigaction(forwarded[i], &action, NULL);
    }
    ptrace(PTRACE_CONT, program, 0, 0);
    for (;;) {
        pid_t tid = waitpid(-1, &status, __WALL);
        if (tid < 0) {
            if (errno == EINTR) continue;
            return 1;
        }
        if (WIFEXITED(status) || WIFSIGNALED(status)) {
            if (tid == program) {
                if (WIFEXITED(status)) return WEXITSTATUS(status);
                return 128 + WTERMSIG(status);
            }
            forget(tid);
            continue;
        }
        if (!WIFSTOPPED(status)) continue;
        int sig = WSTOPSIG(status);
        int event = status >> 16;
        int deliver = 0;
        if (sig == SIGTRAP && event == PTRACE_EVENT_SECCOMP) {
            answer_clock(tid);
        } else if (sig == SIGTRAP && event == PTRACE_EVENT_EXEC) {
            hide_vdso(tid);
        } else if (sig == SIGTRAP && event != 0) {
            /* clone, fork, vfork: the new task is traced and stops by itself */
        } else if (sig == SIGSTOP && first_stop(tid)) {
            /* a new thread's start-up stop */
        } else {
            deliver = sig;
        }
        ptrace(PTRACE_CONT, tid, 0, (void *)(long)deliver);
    }
}
