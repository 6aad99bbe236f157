/* launch: the compiled form of arranger.agent.launcher's LAUNCHER, with the same spec, the same
 * exit codes and the same failure record. It runs as the pod's user (setpriv switched to it):
 * reads the spec from the memfd named by its one argument
 * ("spec\0CWD\0NPROC\0COUNT\0ARGV...\0ENV..."), sets RLIMIT_NPROC (soft and hard) to NPROC
 * unless it is 0 (never above the hard limit it has), enters CWD, looks ARGV[0] up in the spec's PATH as execvpe does (PATH unset: /bin:/usr/bin;
 * the first error other than "not there" wins) and execs it with exactly the spec's
 * environment. When it cannot, it overwrites the memfd with "fail\0CODE\0KIND: MESSAGE",
 * writes "arranger: MESSAGE" to the pod's log and exits 127 (no such program or directory) or
 * 126 (it cannot be run). KIND is CommandNotFound (ENOENT, ENOTDIR), CommandNotExecutable
 * (EACCES, EPERM, ENOEXEC) or StartError (anything else, and a working directory it cannot
 * enter); MESSAGE is at most MESSAGE_MAX bytes.
 * It reads nothing else: no environment, no file, no locale. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static int spec = -1;
static const char *program = "";

#define MESSAGE_MAX 4000

static int code_of(int err) { return err == ENOENT || err == ENOTDIR ? 127 : 126; }

static const char *kind_of(int err) {
    if (err == ENOENT || err == ENOTDIR) return "CommandNotFound";
    if (err == EACCES || err == EPERM || err == ENOEXEC) return "CommandNotExecutable";
    return "StartError";
}

/* quoted: `s` with backslash and backquote escaped by a backslash, printable ASCII as it is,
 * other bytes as \xNN. */
static void quoted(char *out, size_t room, const char *s) {
    size_t n = 0;
    for (; *s && n + 5 < room; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\\' || c == '`') {
            out[n++] = '\\';
            out[n++] = (char)c;
        } else if (c >= 0x20 && c < 0x7f) {
            out[n++] = (char)c;
        } else {
            n += (size_t)snprintf(out + n, room - n, "\\x%02x", c);
        }
    }
    out[n] = '\0';
}

/* fail: records why the program cannot start (`why` follows "cannot start `PROGRAM`: "),
 * tells the log, and exits with `code`. */
static void fail(int code, const char *kind, const char *why) {
    static char name[4 * MESSAGE_MAX], message[MESSAGE_MAX + 1], out[MESSAGE_MAX + 64];
    quoted(name, sizeof name, program);
    snprintf(message, sizeof message, "cannot start `%s`: %s", name, why);
    int len = snprintf(out, sizeof out, "fail%c%d%c%s: %s", 0, code, 0, kind, message);
    if (ftruncate(spec, 0) == 0 && pwrite(spec, out, (size_t)len, 0) < 0) { /* best effort */ }
    len = snprintf(out, sizeof out, "arranger: %s\n", message);
    if (write(2, out, (size_t)len) < 0) { /* the log is gone: the record still says why */ }
    _exit(code);
}

/* run: execs `file` (searched in PATH when it has no slash); returns the error to report and
 * sets *where to the candidate that gave it when that error is not "not there" (else NULL). */
static int run(const char *file, char **argv, char **env, const char *path, char **where) {
    *where = NULL;
    if (strchr(file, '/')) {
        execve(file, argv, env);
        return errno;
    }
    size_t flen = strlen(file);
    int saved = 0, last = ENOENT;
    for (const char *dir = path;; dir++) {
        const char *end = strchrnul(dir, ':');
        size_t dlen = (size_t)(end - dir);
        while (dlen && dir[dlen - 1] == '/') dlen--;
        char *candidate = malloc(dlen + flen + 2);
        if (!candidate) return ENOMEM;
        if (end != dir) {  /* "dir" + "/" + file; an empty entry means the file itself */
            memcpy(candidate, dir, dlen);
            candidate[dlen] = '/';
            memcpy(candidate + dlen + 1, file, flen + 1);
        } else {
            memcpy(candidate, file, flen + 1);
        }
        execve(candidate, argv, env);
        last = errno;
        if (last != ENOENT && last != ENOTDIR && !saved) {
            saved = last;
            *where = candidate;
        } else {
            free(candidate);
        }
        if (!*end) break;
        dir = end;
    }
    return saved ? saved : last;
}

int main(int argc, char **argv) {
    static char reason[8192];
    if (argc != 2) return 2;
    spec = atoi(argv[1]);
    if (fcntl(spec, F_SETFD, FD_CLOEXEC) < 0) return 2;
    struct stat st;
    if (fstat(spec, &st) < 0) return 2;
    size_t size = (size_t)st.st_size;
    char *data = malloc(size + 1);
    if (!data) return 2;
    for (size_t got = 0; got < size;) {
        ssize_t n = pread(spec, data + got, size - got, (off_t)got);
        if (n <= 0) return 2;
        got += (size_t)n;
    }
    data[size] = '\0';
    size_t parts = 1;
    for (size_t i = 0; i < size; i++) parts += data[i] == '\0';
    char **part = calloc(parts + 2, sizeof *part);
    if (!part || parts < 4) return 2;
    part[0] = data;
    for (size_t i = 0, k = 1; i < size; i++)
        if (data[i] == '\0') part[k++] = data + i + 1;
    rlim_t nproc = (rlim_t)strtoull(part[2], NULL, 10);
    size_t count = strtoul(part[3], NULL, 10);
    if (count > parts - 4) return 2;
    /* argv: parts 4 .. 4+count, NULL-terminated in place of the first variable (kept aside). */
    char *empty[] = {"", NULL};
    char **args = count ? part + 4 : empty;
    size_t nenv = parts - 4 - count;
    char **env = calloc(nenv + 1, sizeof *env);
    if (!env) return 2;
    memcpy(env, part + 4 + count, nenv * sizeof *env);
    if (count) part[4 + count] = NULL;
    program = args[0];
    if (nproc) {
        struct rlimit limit;
        if (getrlimit(RLIMIT_NPROC, &limit) == 0 && limit.rlim_max != RLIM_INFINITY &&
            limit.rlim_max < nproc)
            nproc = limit.rlim_max;
        limit.rlim_cur = limit.rlim_max = nproc;
        if (setrlimit(RLIMIT_NPROC, &limit) < 0) {
            snprintf(reason, sizeof reason, "cannot set RLIMIT_NPROC: %s", strerror(errno));
            fail(126, "StartError", reason);
        }
    }
    if (chdir(part[1]) < 0) {
        int err = errno;
        snprintf(reason, sizeof reason, "cannot enter working directory %s: %s", part[1],
                 strerror(err));
        fail(code_of(err), "StartError", reason);
    }
    const char *path = "/bin:/usr/bin";
    for (char **e = env; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
    char *where;
    int err = run(args[0], args, env, path, &where);
    if (strchr(args[0], '/'))
        snprintf(reason, sizeof reason, "%s", strerror(err));
    else if (where)
        snprintf(reason, sizeof reason, "%s (%s)", strerror(err), where);
    else
        /* Not the PATH itself: it is the job's, hidden from other users, who read reasons. */
        snprintf(reason, sizeof reason, "%s (not found in the pod's PATH)", strerror(err));
    fail(code_of(err), kind_of(err), reason);
    return 0;
}
