/* shim: the compiled form of arranger.agent.process's SHIM and WATCH, with the same
 * environment, descriptors and exit codes. It runs as the agent's user (root on a shared node),
 * as the leader of the pod's process group, and sees nothing of the pod: its arguments are the
 * launcher's command (all of the agent's making) and its environment the agent's own values.
 *
 *   - It writes its pid to each cgroup.procs file in ARRANGER_CGROUP_PROCS (space-separated),
 *     so the pod is charged from its first byte; exit 125 when it cannot.
 *   - TERM, INT and HUP only interrupt its wait (a handler, not an ignore, which exec would
 *     pass on to the pod): it outlives a TERM sent to the group long enough to record the code.
 *   - With ARRANGER_GATE_FD, it first waits for a line on that descriptor (the agent writes it
 *     once the run is recorded); a pipe that closes without one means the agent died before
 *     recording the run: exit 125, running nothing. The descriptor is then closed.
 *   - With ARRANGER_AGENT_LOCK, a watch (a child, named arranger-fence, in the pod's group)
 *     fences the pod once no agent holds the lock and the server was last heard (the mtime of
 *     ARRANGER_SERVER_HEARD) longer ago than the timeout that file holds, in milliseconds (0:
 *     never): it writes "Fenced" to ARRANGER_FENCE_MARK, says so in the log, sends TERM to
 *     the group and KILL after ARRANGER_FENCE_GRACE_S seconds. An agent that took the lock
 *     meanwhile keeps the pod.
 *   - It runs the command with stdin from /dev/null and none of the variables above, waits for
 *     it, writes its exit code (128 + N for signal N) and a newline to descriptor 0 (a file
 *     the agent opened, where the pod cannot reach), stops the watch and exits with the code. */
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

#define REFUSED 125 /* the pod was not started: its cgroup or its gate said no */

static void interrupted(int sig) { (void)sig; }

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

/* gate_opens: reads up to a newline from descriptor `fd`; false when the pipe ends first. */
static int gate_opens(int fd) {
    char c;
    for (;;) {
        ssize_t n = read(fd, &c, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;
        if (c == '\n') return 1;
    }
}

/* lock_free: takes and lets go of a shared lock on `path` (made if missing, as flock(1)
 * does), waiting while an agent holds it unless `now`; false when it is held (with `now`). */
static int lock_free(const char *path, int now) {
    int fd = open(path, O_RDONLY | O_CREAT | O_NOCTTY | O_CLOEXEC, 0600);
    if (fd < 0) return 1; /* as flock(1) failing: nothing is known to hold it */
    int rc;
    do rc = flock(fd, LOCK_SH | (now ? LOCK_NB : 0));
    while (rc < 0 && errno == EINTR);
    close(fd); /* closing lets go */
    return rc == 0;
}

/* timeout_ms: the fence timeout `heard` holds (its first line), 0 when none or not above 0. */
static long long timeout_ms(const char *heard) {
    char line[64] = "";
    int fd = open(heard, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, line, sizeof line - 1);
    close(fd);
    if (n <= 0) return 0;
    line[n] = '\0';
    line[strcspn(line, "\n")] = '\0';
    char *end;
    errno = 0;
    long long t = strtoll(line, &end, 10);
    return errno || end == line || *end || t <= 0 ? 0 : t;
}

static long long ms_of(struct timespec t) { return t.tv_sec * 1000LL + t.tv_nsec / 1000000; }

static void sleep_ms(long long ms) {
    struct timespec left = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&left, &left) < 0 && errno == EINTR) {}
}

/* watch: the fence (see the top of this file); ends the process. */
static void watch(const char *lock, const char *heard, const char *mark, long long grace_s) {
    signal(SIGTERM, SIG_DFL);  /* the shim's stop (USR1), or the group's TERM: it ends */
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    prctl(PR_SET_NAME, "arranger-fence");
    for (;;) {
        lock_free(lock, 0);
        long long t = timeout_ms(heard);
        struct stat st;
        if (!t || stat(heard, &st) < 0) _exit(0);
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        long long left = ms_of(st.st_mtim) + t - ms_of(now);
        if (left > 0) {
            sleep_ms(left);
            continue;
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
        sleep_ms(grace_s * 1000);
        kill(0, SIGKILL);
        _exit(0);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *procs = getenv("ARRANGER_CGROUP_PROCS");
    if (procs && *procs && join_cgroups(procs) < 0) return REFUSED;
    struct sigaction on = {0};
    on.sa_handler = interrupted;
    sigemptyset(&on.sa_mask);
    sigaction(SIGTERM, &on, NULL);
    sigaction(SIGINT, &on, NULL);
    sigaction(SIGHUP, &on, NULL);
    const char *gate = getenv("ARRANGER_GATE_FD");
    if (gate && *gate) {
        int fd = atoi(gate);
        if (!gate_opens(fd)) return REFUSED;
        close(fd);
    }
    const char *lock = getenv("ARRANGER_AGENT_LOCK");
    pid_t watcher = 0;
    if (lock && *lock) {
        const char *heard = getenv("ARRANGER_SERVER_HEARD");
        const char *mark = getenv("ARRANGER_FENCE_MARK");
        const char *grace = getenv("ARRANGER_FENCE_GRACE_S");
        watcher = fork();
        if (watcher == 0) watch(lock, heard ? heard : "", mark ? mark : "", grace ? atoll(grace) : 5);
        if (watcher < 0) watcher = 0; /* no fence, as where flock(1) is missing */
    }
    const char *shim_values[] = {"ARRANGER_CGROUP_PROCS", "ARRANGER_GATE_FD",
                                 "ARRANGER_AGENT_LOCK", "ARRANGER_SERVER_HEARD",
                                 "ARRANGER_FENCE_MARK", "ARRANGER_FENCE_GRACE_S"};
    for (size_t i = 0; i < sizeof shim_values / sizeof *shim_values; i++) unsetenv(shim_values[i]);
    pid_t pod = fork();
    if (pod == 0) {
        struct sigaction plain = {0};
        plain.sa_handler = SIG_DFL;
        sigaction(SIGTERM, &plain, NULL);
        sigaction(SIGINT, &plain, NULL);
        sigaction(SIGHUP, &plain, NULL);
        int null = open("/dev/null", O_RDONLY);
        if (null < 0 || dup2(null, 0) < 0) _exit(REFUSED);
        if (null != 0) close(null);
        execv(argv[1], argv + 1);
        dprintf(2, "arranger: the shim cannot run %s: %s\n", argv[1], strerror(errno));
        _exit(127);
    }
    int code = REFUSED;
    if (pod > 0) {
        int status;
        pid_t got;
        do got = waitpid(pod, &status, 0);
        while (got < 0 && errno == EINTR);
        if (got == pod) code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    dprintf(0, "%d\n", code);
    if (watcher > 0) kill(watcher, SIGUSR1);
    return code;
}
