/* shim: the compiled form of arranger.agent.process's SHIM and WATCH, with the same
 * environment, descriptors and exit codes. It runs as the agent's user (root on a shared node),
 * as the leader of the pod's process group, and sees nothing of the pod: its arguments are the
 * launcher's command (all of the agent's making) and its environment the agent's own values.
 *
 *   - It writes its pid to each cgroup.procs file in ARRANGER_CGROUP_PROCS (space-separated),
 *     so the pod is charged from its first byte; exit 125 when it cannot.
 *   - TERM, INT and HUP only interrupt its wait for the pod (a handler, not an ignore, which
 *     exec would pass on to the pod): it outlives a TERM sent to the group long enough to
 *     record the code. One that comes before the pod starts stops it there: exit 125, running
 *     nothing, as the shell's `read` at the gate gives up on a trapped signal.
 *   - With ARRANGER_GATE_FD, it first waits for a line on that descriptor (the agent writes it
 *     once the run is recorded); a pipe that closes without one means the agent died before
 *     recording the run: exit 125, running nothing. The descriptor is then closed.
 *   - With ARRANGER_AGENT_LOCK, a watch (a child, named arranger-fence, in the pod's group)
 *     fences the pod once no agent holds the lock and the server was last heard (the mtime of
 *     ARRANGER_SERVER_HEARD) longer ago than the timeout that file holds, in milliseconds (0:
 *     never): it writes "Fenced" to ARRANGER_FENCE_MARK, says so in the log, sends TERM to
 *     the group and KILL after ARRANGER_FENCE_GRACE_S seconds. An agent that took the lock
 *     meanwhile keeps the pod. A lock file that cannot be opened holds no agent. Without the
 *     watch there is no pod: a watch that cannot be forked is exit 125, running nothing.
 *   - It runs the command with stdin from /dev/null and none of the variables above, waits for
 *     it, writes its exit code (128 + N for signal N) and a newline to descriptor 0 (a file
 *     the agent opened, where the pod cannot reach), stops the watch and exits with the code.
 *     A pod it cannot fork, or a command it cannot exec (126, or 127 when there is no such
 *     file), is said in the log; a pod never forked records no code (exit 2), as with sh. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REFUSED 125 /* the pod was not started: its cgroup, its gate or a signal said no */
#define NOT_FORKED 2 /* as sh's "Cannot fork" */
#define MAX_TIMEOUT_MS (100LL * 365 * 86400 * 1000) /* a century: past it, never */
#define MAX_GRACE_S 3600LL

static volatile sig_atomic_t stopped; /* a TERM, INT or HUP came */

static void interrupted(int sig) { stopped = sig; }

static void set_stop_signals(void (*handler)(int)) {
    struct sigaction action = {0};
    action.sa_handler = handler;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGHUP, &action, NULL);
}

static void mask_stop_signals(int how) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(how, &set, NULL);
}

/* join_cgroups: writes this process's pid to each cgroup.procs file named in `paths`. */
static int join_cgroups(const char *paths) {
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    char *copy = strdup(paths), *save = NULL;
    if (!copy) return -1;
    for (char *path = strtok_r(copy, " ", &save); path; path = strtok_r(NULL, " ", &save)) {
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, pid, (size_t)len) != len) {
            if (fd >= 0) close(fd);
            free(copy);
            return -1;
        }
        close(fd);
    }
    free(copy);
    return 0;
}

/* gate_opens: reads up to a newline from descriptor `fd`; false when the pipe ends first or a
 * stop signal interrupts the wait. */
static int gate_opens(int fd) {
    char c;
    for (;;) {
        ssize_t n = read(fd, &c, 1);
        if (n <= 0) return 0;
        if (c == '\n') return 1;
    }
}

/* lock_free: takes and lets go of a shared lock on `path` (made if missing, as flock(1)
 * does), waiting while an agent holds it unless `now`; false when it is held (with `now`). */
static int lock_free(const char *path, int now) {
    int fd = open(path, O_RDONLY | O_CREAT | O_NOCTTY | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return 1; /* no agent can hold a lock on a file no one can open */
    int rc;
    do rc = flock(fd, LOCK_SH | (now ? LOCK_NB : 0));
    while (rc < 0 && errno == EINTR);
    close(fd); /* closing lets go */
    return rc == 0;
}

/* timeout_ms: the fence timeout `heard` holds (its first line, blanks around it allowed), 0
 * when none, not a number above 0 or above a century. */
static long long timeout_ms(const char *heard) {
    char line[64] = "";
    int fd = open(heard, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, line, sizeof line - 1);
    close(fd);
    if (n <= 0) return 0;
    line[n] = '\0';
    line[strcspn(line, "\n")] = '\0';
    char *end;
    errno = 0;
    long long t = strtoll(line, &end, 10);
    while (*end == ' ' || *end == '\t' || *end == '\r') end++;
    return errno || end == line || *end || t <= 0 || t > MAX_TIMEOUT_MS ? 0 : t;
}

/* sleep_until: sleeps until wall-clock time `at` (a step of the clock moves the wake). */
static void sleep_until(struct timespec at) {
    while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &at, NULL) == EINTR) {}
}

/* watch: the fence (see the top of this file); ends the process. */
static void watch(const char *lock, const char *heard, const char *mark, long long grace_s) {
    set_stop_signals(SIG_DFL); /* the shim's stop (USR1), or the group's TERM: it ends */
    mask_stop_signals(SIG_UNBLOCK);
    prctl(PR_SET_NAME, "arranger-fence");
    for (;;) {
        lock_free(lock, 0);
        long long t = timeout_ms(heard);
        struct stat st;
        if (!t || stat(heard, &st) < 0) _exit(0);
        struct timespec due = st.st_mtim, now;
        due.tv_sec += t / 1000;
        due.tv_nsec += (t % 1000) * 1000000;
        if (due.tv_nsec >= 1000000000) {
            due.tv_sec++;
            due.tv_nsec -= 1000000000;
        }
        clock_gettime(CLOCK_REALTIME, &now);
        if (now.tv_sec < due.tv_sec || (now.tv_sec == due.tv_sec && now.tv_nsec < due.tv_nsec)) {
            sleep_until(due);
            continue; /* heard meanwhile? look again */
        }
        if (!lock_free(lock, 1)) continue; /* an agent is back */
        int fd = open(mark, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) {
            if (write(fd, "Fenced\n", 7) < 0) { /* the log still says it */ }
            close(fd);
        }
        dprintf(2, "arranger: fenced: no agent heard the server for %lld s; stopping the pod\n",
                t / 1000);
        signal(SIGTERM, SIG_IGN);
        kill(0, SIGTERM);
        struct timespec end;
        clock_gettime(CLOCK_REALTIME, &end);
        end.tv_sec += grace_s;
        sleep_until(end);
        kill(0, SIGKILL);
        _exit(0);
    }
}

/* grace_of: ARRANGER_FENCE_GRACE_S, whole seconds within 0..MAX_GRACE_S (else 5). */
static long long grace_of(const char *value) {
    char *end;
    long long grace = value ? strtoll(value, &end, 10) : -1;
    return value && *value && !*end && grace >= 0 && grace <= MAX_GRACE_S ? grace : 5;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    set_stop_signals(interrupted);
    const char *procs = getenv("ARRANGER_CGROUP_PROCS");
    if (procs && *procs && join_cgroups(procs) < 0) return REFUSED;
    const char *gate = getenv("ARRANGER_GATE_FD");
    if (gate && *gate) {
        int fd = atoi(gate);
        if (!gate_opens(fd)) return REFUSED;
        close(fd);
    }
    /* From here the stop signals wait (blocked) until each child has its own handling: one
     * sent to the group meanwhile reaches the pod, pending, as soon as it starts. */
    mask_stop_signals(SIG_BLOCK);
    if (stopped) return REFUSED;
    const char *lock = getenv("ARRANGER_AGENT_LOCK");
    pid_t watcher = 0;
    if (lock && *lock) {
        const char *heard = getenv("ARRANGER_SERVER_HEARD");
        const char *mark = getenv("ARRANGER_FENCE_MARK");
        long long grace_s = grace_of(getenv("ARRANGER_FENCE_GRACE_S"));
        watcher = fork();
        if (watcher == 0) watch(lock, heard ? heard : "", mark ? mark : "", grace_s);
        if (watcher < 0) {
            dprintf(2, "arranger: the shim cannot fork the fence watch: %s\n", strerror(errno));
            return REFUSED;
        }
    }
    const char *shim_values[] = {"ARRANGER_CGROUP_PROCS", "ARRANGER_GATE_FD",
                                 "ARRANGER_AGENT_LOCK", "ARRANGER_SERVER_HEARD",
                                 "ARRANGER_FENCE_MARK", "ARRANGER_FENCE_GRACE_S"};
    for (size_t i = 0; i < sizeof shim_values / sizeof *shim_values; i++) unsetenv(shim_values[i]);
    pid_t pod = fork();
    if (pod == 0) {
        set_stop_signals(SIG_DFL);
        mask_stop_signals(SIG_UNBLOCK);
        int null = open("/dev/null", O_RDONLY);
        if (null < 0 || dup2(null, 0) < 0) _exit(REFUSED);
        if (null != 0) close(null);
        execv(argv[1], argv + 1);
        int err = errno;
        dprintf(2, "arranger: the shim cannot run %s: %s\n", argv[1], strerror(err));
        _exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
    }
    if (pod < 0) {
        dprintf(2, "arranger: the shim cannot fork the pod: %s\n", strerror(errno));
        if (watcher > 0) kill(watcher, SIGUSR1);
        return NOT_FORKED;
    }
    mask_stop_signals(SIG_UNBLOCK); /* the shim's own handler takes them now: it waits on */
    int code = REFUSED;
    for (;;) {
        int status;
        pid_t got = waitpid(-1, &status, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) break;
        if (got == watcher) {
            watcher = 0; /* it ended (no fence timeout): reaped, its pid no longer ours */
            continue;
        }
        if (got == pod) {
            code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            break;
        }
    }
    dprintf(0, "%d\n", code);
    if (watcher > 0) kill(watcher, SIGUSR1);
    return code;
}
