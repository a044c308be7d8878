/* xrl_client: the host side of xrl's policy-server pipe protocol (xrl/serve/pipe.py), in C99 + POSIX.
 *
 * It creates the named pipes (mkfifo), starts `xrl serve` and the graph-holding env side
 * (clients/c/env_side.py: xrl's graphs and rewrites are Python), and runs one optimisation episode:
 *
 *   env side --(header, observations)--> xrl_client --(same, checked)--> xrl serve
 *   env side <--------(advice)----------- xrl_client <------(advice)----- xrl serve
 *
 * Every message is parsed and checked here (the header's tensor specs give each buffer's size), so a
 * malformed message from either side ends the exchange. Every read waits at most --timeout seconds
 * (poll), so nothing hangs. --truncate-at K sends observation K cut short, to test the server's errors.
 * The pipes and their folder are removed at the end (the host's job). Exit 0: a clean episode.
 *
 *   cc -std=c99 -O2 -o xrl_client clients/c/xrl_client.c
 *   ./xrl_client --python .venv/bin/python --env-side clients/c/env_side.py --graph mlp
 *
 * The server is `PY -m MODULE serve --in PIPE --out PIPE --timeout S [--policy P]`: MODULE `xrl` (xrl serve:
 * hint or MaskablePPO policies, the env's graph observation) or `xrl.policies.release` (an exported
 * policy, FILE.onnx, reading its padded inputs: --observation release).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_LINE (1 << 20) /* as xrl.serve.pipe.MAX_LINE */
#define MAX_FEATURES 64

static int timeout_ms = 60000;
static char dir[256];
static char p_c2s[300], p_s2c[300], p_e2c[300], p_c2e[300];
static pid_t server_pid = -1, env_pid = -1;
static int server_closed = 0; /* the pipe to the server is closed (the truncation test closes it early) */

static void cleanup(void) {
    unlink(p_c2s); unlink(p_s2c); unlink(p_e2c); unlink(p_c2e);
    if (dir[0]) rmdir(dir);
}

static void fail(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "xrl_client: error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* Read exactly n bytes, each wait bounded by the timeout: 1 ok, 0 end of file before any byte, -1 error. */
static int read_exact(int fd, char *buf, size_t n, const char *what) {
    size_t got = 0;
    while (got < n) {
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, timeout_ms);
        if (r == 0) { fail("no data for %d ms while reading %s", timeout_ms, what); return -1; }
        if (r < 0) { if (errno == EINTR) continue; fail("poll: %s", strerror(errno)); return -1; }
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0) { if (errno == EINTR) continue; fail("reading %s: %s", what, strerror(errno)); return -1; }
        if (k == 0) {
            if (got == 0) return 0;
            fail("truncated %s: %zu of %zu bytes before the pipe closed", what, got, n);
            return -1;
        }
        got += (size_t)k;
    }
    return 1;
}

/* One line without its newline into buf (NUL-terminated): its length, -2 at end of file before it, -1 error. */
static long read_line(int fd, char *buf, const char *what) {
    long n = 0;
    for (;;) {
        char c;
        int r = read_exact(fd, &c, 1, what);
        if (r < 0) return -1;
        if (r == 0) {
            if (n == 0) return -2;
            fail("truncated %s: the pipe closed mid-line", what);
            return -1;
        }
        if (c == '\n') { buf[n] = 0; return n; }
        if (n >= MAX_LINE - 1) { fail("malformed %s: no newline in %d bytes", what, MAX_LINE); return -1; }
        buf[n++] = c;
    }
}

static int write_all(int fd, const char *buf, size_t n, const char *what) {
    while (n > 0) {
        ssize_t k = write(fd, buf, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            fail("writing %s: %s", what, strerror(errno));
            return -1;
        }
        buf += k;
        n -= (size_t)k;
    }
    return 0;
}

static size_t type_size(const char *t, size_t len) {
    static const struct { const char *name; size_t size; } types[] = {
        {"float32", 4}, {"float64", 8}, {"int64", 8}, {"int32", 4}, {"int8", 1}, {"uint8", 1}, {"bool", 1}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strlen(types[i].name) == len && strncmp(types[i].name, t, len) == 0) return types[i].size;
    return 0;
}

/* The byte size of the tensor spec object starting at *s ({"name": ..., "shape": [...], "type": "..."});
 * *s is moved past it. 0 on a malformed spec. A small reader for the one JSON shape the protocol uses. */
static size_t spec_bytes(const char **s) {
    const char *p = strchr(*s, '{'), *end;
    if (!p || !(end = strchr(p, '}'))) return 0;
    const char *shape = strstr(p, "\"shape\""), *type = strstr(p, "\"type\"");
    if (!shape || !type || shape > end || type > end) return 0;
    size_t count = 1;
    const char *q = strchr(shape, '[');
    if (!q || q > end) return 0;
    for (q++; *q != ']'; ) {
        while (*q == ' ' || *q == ',') q++;
        if (*q == ']') break;
        char *after;
        long d = strtol(q, &after, 10);
        if (after == q || d < 0) return 0;
        count *= (size_t)d;
        q = after;
    }
    const char *t = strchr(type + 6, '"');
    if (!t || t > end) return 0;
    const char *t_end = strchr(t + 1, '"');
    if (!t_end || t_end > end) return 0;
    size_t size = type_size(t + 1, (size_t)(t_end - t - 1));
    if (!size) return 0;
    *s = end + 1;
    return count * size == 0 ? (size_t)-1 : count * size; /* (size_t)-1: an empty tensor */
}

/* Sizes of the header's features and advice; the feature count, -1 if malformed. */
static int parse_header(const char *line, size_t *sizes, size_t *advice) {
    const char *f = strstr(line, "\"features\""), *a = strstr(line, "\"advice\"");
    if (!f || !a || line[0] != '{') return -1;
    const char *p = strchr(f, '['), *close;
    if (!p) return -1;
    int n = 0;
    for (p++; ; n++) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ']') break;
        if (n == MAX_FEATURES) return -1;
        size_t s = spec_bytes(&p);
        if (!s) return -1;
        sizes[n] = s == (size_t)-1 ? 0 : s;
    }
    close = a;
    size_t s = spec_bytes(&close);
    if (!s || s == (size_t)-1) return -1;
    *advice = s;
    return n;
}

static void on_alarm(int sig) { (void)sig; }

static int start_timeout_s = 300;
static int exited(pid_t pid, const char *name);

/* open() of a FIFO blocks until the other side opens it too. Waited for in 1 s slices (an alarm
 * interrupts open), checking that both children still live: a child that dies, or fails to start,
 * ends the wait at once; a slow start (importing torch on a loaded machine) gets --start-timeout. */
static int open_fifo(const char *path, int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; /* no SA_RESTART: the alarm interrupts open() with EINTR */
    sigaction(SIGALRM, &sa, NULL);
    for (int waited = 0; ; waited++) {
        alarm(1);
        int fd = open(path, flags);
        int err = errno;
        alarm(0);
        if (fd >= 0) return fd;
        if (err != EINTR) { fail("opening %s: %s", path, strerror(err)); return -1; }
        if (exited(server_pid, "xrl serve") || exited(env_pid, "the env side")) return -1;
        if (waited >= start_timeout_s) {
            fail("opening %s: the other side did not open it within %d s", path, start_timeout_s);
            return -1;
        }
    }
}

static pid_t spawn(char *const argv[]) {
    pid_t pid = fork();
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "xrl_client: error: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

/* Whether the child has already exited (then reaped, and said so): it will never open its pipe. */
static int exited(pid_t pid, const char *name) {
    int status;
    if (pid <= 0 || waitpid(pid, &status, WNOHANG) != pid) return 0;
    fail("%s exited (status %d) before opening its pipe", name, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    if (pid == server_pid) server_pid = -1; else env_pid = -1;
    return 1;
}

/* The child's exit status, waiting at most the timeout (then it is killed): -1 if killed or not started. */
static int reap(pid_t pid, const char *name) {
    if (pid <= 0) return -1;
    for (int waited = 0; ; waited += 50) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (waited >= timeout_ms) {
            fail("%s did not exit within %d ms; killing it", name, timeout_ms);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* The relay: header, then observations and advice until the env side closes its end. The decision count, -1 on error. */
static long exchange(int from_env, int to_env, int to_server, int from_server, long truncate_at) {
    static char line[MAX_LINE];
    size_t sizes[MAX_FEATURES], advice_size;
    long n = read_line(from_env, line, "header");
    if (n < 0) { if (n == -2) fail("the env side closed before its header"); return -1; }
    int nf = parse_header(line, sizes, &advice_size);
    if (nf < 0) { fail("malformed header: expected {\"features\": [...], \"advice\": {...}}"); return -1; }
    if (advice_size != 8) { fail("advice must be one int64, not %zu bytes", advice_size); return -1; }
    line[n] = '\n';
    if (write_all(to_server, line, (size_t)n + 1, "header") < 0) return -1;
    for (long k = 0; ; k++) {
        n = read_line(from_env, line, "observation line");
        if (n == -2) return k; /* the env side is done: a clean end */
        if (n < 0) return -1;
        char expect[64];
        snprintf(expect, sizeof expect, "{\"observation\": %ld}", k);
        if (strcmp(line, expect) != 0) { fail("malformed observation line: expected %s", expect); return -1; }
        line[n] = '\n';
        if (write_all(to_server, line, (size_t)n + 1, "observation line") < 0) return -1;
        for (int i = 0; i < nf; i++) {
            char *buf = malloc(sizes[i] ? sizes[i] : 1);
            if (!buf) { fail("out of memory for a %zu-byte feature", sizes[i]); return -1; }
            int r = read_exact(from_env, buf, sizes[i], "feature buffer");
            if (r == 0 && sizes[i]) fail("truncated observation %ld: the env side closed mid-message", k);
            size_t send = sizes[i];
            if (k == truncate_at) send /= 2; /* the test of the server's errors: half a buffer, then close */
            if ((r <= 0 && sizes[i]) || write_all(to_server, buf, send, "feature buffer") < 0) {
                free(buf);
                return -1;
            }
            free(buf);
            if (k == truncate_at) {
                close(to_server);
                server_closed = 1;
                char a[8];
                if (read_exact(from_server, a, 8, "advice") == 0)
                    fail("the server closed the advice pipe after truncated observation %ld (as it must)", k);
                return -1;
            }
        }
        char nl;
        if (read_exact(from_env, &nl, 1, "observation end") <= 0 || nl != '\n') {
            fail("malformed observation %ld: no newline after its buffers", k);
            return -1;
        }
        if (write_all(to_server, "\n", 1, "observation end") < 0) return -1;
        char advice[8];
        int r = read_exact(from_server, advice, 8, "advice");
        if (r == 0) fail("the server closed the advice pipe without answering observation %ld", k);
        if (r <= 0 || write_all(to_env, advice, 8, "advice") < 0) return -1;
    }
}

static void usage(void) {
    fprintf(stderr, "usage: xrl_client [--python PY] [--env-side PATH] [--graph NAME] [--max-candidates N]\n"
                    "                  [--horizon N] [--observation graph|release] [--server-module MODULE]\n"
                    "                  [--policy P] [--timeout S] [--start-timeout S] [--truncate-at K]\n");
}

int main(int argc, char **argv) {
    const char *python = "python3", *env_side = "clients/c/env_side.py", *graph = "mlp", *policy = NULL;
    const char *max_cand = "16", *horizon = "0", *observation = "graph", *server_module = "xrl";
    long truncate_at = -1;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { usage(); return 2; }
        if (!strcmp(argv[i], "--python")) python = v;
        else if (!strcmp(argv[i], "--env-side")) env_side = v;
        else if (!strcmp(argv[i], "--graph")) graph = v;
        else if (!strcmp(argv[i], "--policy")) policy = v;
        else if (!strcmp(argv[i], "--max-candidates")) max_cand = v;
        else if (!strcmp(argv[i], "--horizon")) horizon = v;
        else if (!strcmp(argv[i], "--observation")) observation = v;
        else if (!strcmp(argv[i], "--server-module")) server_module = v;
        else if (!strcmp(argv[i], "--timeout")) timeout_ms = (int)(atof(v) * 1000);
        else if (!strcmp(argv[i], "--truncate-at")) truncate_at = atol(v);
        else if (!strcmp(argv[i], "--start-timeout")) start_timeout_s = atoi(v);
        else { usage(); return 2; }
        i++;
    }
    if (timeout_ms <= 0) { fail("--timeout must be positive"); return 2; }
    signal(SIGPIPE, SIG_IGN); /* a closed pipe is an error to report (EPIPE), not a reason to die */

    snprintf(dir, sizeof dir, "/tmp/xrl_client.XXXXXX");
    if (!mkdtemp(dir)) { dir[0] = 0; fail("mkdtemp: %s", strerror(errno)); return 1; }
    snprintf(p_c2s, sizeof p_c2s, "%s/to_server", dir);
    snprintf(p_s2c, sizeof p_s2c, "%s/from_server", dir);
    snprintf(p_e2c, sizeof p_e2c, "%s/from_env", dir);
    snprintf(p_c2e, sizeof p_c2e, "%s/to_env", dir);
    const char *paths[] = {p_c2s, p_s2c, p_e2c, p_c2e};
    for (int i = 0; i < 4; i++)
        if (mkfifo(paths[i], 0600) != 0) { fail("mkfifo %s: %s", paths[i], strerror(errno)); cleanup(); return 1; }

    char timeout_s[32];
    snprintf(timeout_s, sizeof timeout_s, "%g", timeout_ms / 1000.0);
    char *server_argv[16] = {(char *)python, "-m", (char *)server_module, "serve", "--in", p_c2s, "--out", p_s2c,
                             "--timeout", timeout_s, NULL};
    if (policy) { server_argv[10] = "--policy"; server_argv[11] = (char *)policy; server_argv[12] = NULL; }
    char *env_argv[] = {(char *)python, (char *)env_side, "--in", p_e2c, "--out", p_c2e, "--graph", (char *)graph,
                        "--max-candidates", (char *)max_cand, "--horizon", (char *)horizon, "--timeout", timeout_s,
                        "--observation", (char *)observation, NULL};
    server_pid = spawn(server_argv);
    env_pid = spawn(env_argv);

    /* The protocol's order: the server opens its IN, then its OUT; the env side (a host) its IN, then OUT. */
    long decisions = -1;
    int to_server = open_fifo(p_c2s, O_WRONLY), from_server = to_server < 0 ? -1 : open_fifo(p_s2c, O_RDONLY);
    int from_env = from_server < 0 ? -1 : open_fifo(p_e2c, O_RDONLY);
    int to_env = from_env < 0 ? -1 : open_fifo(p_c2e, O_WRONLY);
    if (to_env >= 0) decisions = exchange(from_env, to_env, to_server, from_server, truncate_at);
    /* Closing ends the exchange on both sides: the server reads end of file, the env side gets no more advice. */
    if (to_server >= 0 && !server_closed) close(to_server);
    if (to_env >= 0) close(to_env);
    if (from_env >= 0) close(from_env);
    int server_rc = reap(server_pid, "xrl serve");
    if (from_server >= 0) close(from_server);
    int env_rc = reap(env_pid, "the env side");
    cleanup();
    if (decisions < 0) return 1;
    if (server_rc != 0 || env_rc != 0) {
        fail("xrl serve exited with %d, the env side with %d", server_rc, env_rc);
        return 1;
    }
    fprintf(stderr, "xrl_client: %ld decisions relayed to xrl serve\n", decisions);
    return 0;
}
