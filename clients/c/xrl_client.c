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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
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
        if (k < 0) { if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue; fail("reading %s: %s", what, strerror(errno)); return -1; }
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

/* Write all n bytes to a non-blocking fd, each wait for room bounded by the timeout (a reader that stops
 * reading fills the pipe: an error, not a hang). */
static int write_all(int fd, const char *buf, size_t n, const char *what) {
    while (n > 0) {
        ssize_t k = write(fd, buf, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd p = {fd, POLLOUT, 0};
                int r = poll(&p, 1, timeout_ms);
                if (r == 0) { fail("the other side read nothing for %d ms while %s was written", timeout_ms, what); return -1; }
                if (r < 0 && errno != EINTR) { fail("poll: %s", strerror(errno)); return -1; }
                continue;
            }
            fail("writing %s: %s", what, strerror(errno));
            return -1;
        }
        buf += k;
        n -= (size_t)k;
    }
    return 0;
}

static size_t type_size(const char *t) {
    static const struct { const char *name; size_t size; } types[] = {
        {"float32", 4}, {"float64", 8}, {"int64", 8}, {"int32", 4}, {"int8", 1}, {"uint8", 1}, {"bool", 1}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(types[i].name, t) == 0) return types[i].size;
    return 0;
}

/* ----- the header: a small, strict JSON reader -------------------------------------------------------------
 * The header is parsed as JSON, not searched for substrings, so that the client and the server agree on every
 * header: a key inside a string, a feature named "advice" or a name holding "}" mean what JSON says. Stricter
 * than JSON where the protocol is: a key twice in one object, an unknown key in a tensor spec, a dimension that
 * is not a non-negative integer, or nesting deeper than MAX_DEPTH is malformed (xrl serve refuses the same). */
#define MAX_DEPTH 32
#define MAX_NAME 256
#define MAX_RANK 8

typedef struct { const char *p; const char *err; } Json;

static void ws(Json *j) { while (*j->p == ' ' || *j->p == '\t' || *j->p == '\r' || *j->p == '\n') j->p++; }
static int bad(Json *j, const char *why) { if (!j->err) j->err = why; return -1; }
static int eat(Json *j, char c) { ws(j); if (*j->p != c) return bad(j, "unexpected character"); j->p++; return 0; }

/* A string into out (at most cap-1 bytes kept; longer is an error); escapes decoded (\uXXXX as '?'). */
static int json_string(Json *j, char *out, size_t cap) {
    size_t n = 0;
    ws(j);
    if (*j->p != '"') return bad(j, "expected a string");
    for (j->p++; *j->p != '"'; j->p++) {
        char c = *j->p;
        if (c == 0 || (unsigned char)c < 0x20) return bad(j, "unterminated string");
        if (c == '\\') {
            c = *++j->p;
            switch (c) {
            case '"': case '\\': case '/': break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'u':
                for (int k = 1; k <= 4; k++)
                    if (!strchr("0123456789abcdefABCDEF", j->p[k]) || !j->p[k]) return bad(j, "bad \\u escape");
                j->p += 4;
                c = '?';
                break;
            default: return bad(j, "bad escape");
            }
        }
        if (n + 1 >= cap) return bad(j, "string too long");
        out[n++] = c;
    }
    j->p++;
    out[n] = 0;
    return 0;
}

/* Skip any JSON value (the header's other keys), at most MAX_DEPTH deep. */
static int json_skip(Json *j, int depth) {
    static char scratch[MAX_LINE];
    if (depth > MAX_DEPTH) return bad(j, "nested too deeply");
    ws(j);
    char c = *j->p;
    if (c == '"') return json_string(j, scratch, sizeof scratch);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        ws(j);
        if (*j->p == close) { j->p++; return 0; }
        for (;;) {
            if (c == '{') { if (json_string(j, scratch, sizeof scratch) < 0 || eat(j, ':') < 0) return -1; }
            if (json_skip(j, depth + 1) < 0) return -1;
            ws(j);
            if (*j->p == ',') { j->p++; continue; }
            return eat(j, close);
        }
    }
    if (!strncmp(j->p, "true", 4) || !strncmp(j->p, "null", 4)) { j->p += 4; return 0; }
    if (!strncmp(j->p, "false", 5)) { j->p += 5; return 0; }
    char *end;
    strtod(j->p, &end);
    if (end == j->p) return bad(j, "expected a value");
    j->p = end;
    return 0;
}

/* A dimension: a non-negative integer literal (no sign, fraction or exponent), at most SIZE_MAX. */
static int json_dim(Json *j, size_t *out) {
    ws(j);
    if (*j->p < '0' || *j->p > '9') return bad(j, "a dimension must be a non-negative integer");
    size_t v = 0;
    while (*j->p >= '0' && *j->p <= '9') {
        size_t d = (size_t)(*j->p++ - '0');
        if (v > (SIZE_MAX - d) / 10) return bad(j, "a dimension is too large");
        v = v * 10 + d;
    }
    if (*j->p == '.' || *j->p == 'e' || *j->p == 'E') return bad(j, "a dimension must be a non-negative integer");
    *out = v;
    return 0;
}

static size_t max_elements(void) {
    const char *env = getenv("XRL_MAX_ELEMENTS"); /* as xrl.limits.max_elements */
    if (env && *env) {
        char *end;
        unsigned long long v = strtoull(env, &end, 10);
        if (*end == 0 && v > 0) return (size_t)v;
    }
    return (size_t)1 << 29;
}

/* A tensor spec {"name": ..., "shape": [...], "type": ...}: its byte size into *bytes (checked arithmetic,
 * and at most XRL_MAX_ELEMENTS elements, as the server checks). */
static int json_spec(Json *j, size_t *bytes) {
    char key[16], name[MAX_NAME], type[16];
    int have_name = 0, have_shape = 0, have_type = 0;
    size_t count = 1;
    if (eat(j, '{') < 0) return -1;
    for (;;) {
        if (json_string(j, key, sizeof key) < 0) return bad(j, "unknown key in a tensor spec");
        if (eat(j, ':') < 0) return -1;
        if (!strcmp(key, "name")) {
            if (have_name++ || json_string(j, name, sizeof name) < 0) return bad(j, "bad or repeated \"name\"");
        } else if (!strcmp(key, "type")) {
            if (have_type++ || json_string(j, type, sizeof type) < 0) return bad(j, "bad or repeated \"type\"");
        } else if (!strcmp(key, "shape")) {
            if (have_shape++) return bad(j, "repeated \"shape\"");
            if (eat(j, '[') < 0) return -1;
            ws(j);
            int rank = 0;
            if (*j->p == ']') j->p++;
            else for (;;) {
                size_t d;
                if (++rank > MAX_RANK || json_dim(j, &d) < 0) return bad(j, "a shape has at most 8 dimensions");
                if (d && count > SIZE_MAX / d) return bad(j, "a tensor is too large");
                count *= d;
                ws(j);
                if (*j->p == ',') { j->p++; continue; }
                if (eat(j, ']') < 0) return -1;
                break;
            }
        } else {
            return bad(j, "unknown key in a tensor spec");
        }
        ws(j);
        if (*j->p == ',') { j->p++; continue; }
        if (eat(j, '}') < 0) return -1;
        break;
    }
    if (!have_name || !have_shape || !have_type || !name[0]) return bad(j, "a tensor spec needs name, shape and type");
    size_t size = type_size(type);
    if (!size) return bad(j, "unknown tensor type");
    if (count > max_elements()) return bad(j, "a tensor has more elements than XRL_MAX_ELEMENTS");
    *bytes = count * size; /* count <= XRL_MAX_ELEMENTS and size <= 8: no overflow on a 64-bit size_t */
    if (*bytes / size != count) return bad(j, "a tensor is too large");
    return 0;
}

/* Sizes of the header's features and advice; the feature count, -1 if malformed (*why says how). */
static int parse_header(const char *line, size_t *sizes, size_t *advice, const char **why) {
    Json j = {line, NULL};
    int n = -1, have_advice = 0;
    char key[64];
    if (eat(&j, '{') < 0) goto fail;
    ws(&j);
    if (*j.p == '}') { bad(&j, "empty header"); goto fail; }
    for (;;) {
        if (json_string(&j, key, sizeof key) < 0) {
            if (json_skip(&j, 1) < 0) goto fail; /* a long key of no interest was cut short: skip its value */
        } else if (eat(&j, ':') < 0) {
            goto fail;
        } else if (!strcmp(key, "features")) {
            if (n >= 0) { bad(&j, "repeated \"features\""); goto fail; }
            n = 0;
            if (eat(&j, '[') < 0) goto fail;
            ws(&j);
            if (*j.p == ']') j.p++;
            else for (;;) {
                if (n == MAX_FEATURES) { bad(&j, "too many features"); goto fail; }
                if (json_spec(&j, &sizes[n++]) < 0) goto fail;
                ws(&j);
                if (*j.p == ',') { j.p++; continue; }
                if (eat(&j, ']') < 0) goto fail;
                break;
            }
        } else if (!strcmp(key, "advice")) {
            if (have_advice++) { bad(&j, "repeated \"advice\""); goto fail; }
            if (json_spec(&j, advice) < 0) goto fail;
        } else if (json_skip(&j, 1) < 0) {
            goto fail;
        }
        ws(&j);
        if (*j.p == ',') { j.p++; continue; }
        if (eat(&j, '}') < 0) goto fail;
        break;
    }
    ws(&j);
    if (*j.p) { bad(&j, "text after the header object"); goto fail; }
    if (n < 0 || !have_advice) { bad(&j, "expected {\"features\": [...], \"advice\": {...}}"); goto fail; }
    return n;
fail:
    *why = j.err ? j.err : "malformed";
    return -1;
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
        if (fd >= 0) { /* non-blocking from here on: every wait is a poll with the timeout */
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            return fd;
        }
        if (err != EINTR) { fail("opening %s: %s", path, strerror(err)); return -1; }
        if (exited(server_pid, "xrl serve") || exited(env_pid, "the env side")) return -1;
        if (waited >= start_timeout_s) {
            fail("opening %s: the other side did not open it within %d s", path, start_timeout_s);
            return -1;
        }
    }
}

/* SIGTERM, SIGINT, SIGHUP: end both children and remove the pipes and their folder, then exit 128 + sig.
 * Only async-signal-safe calls (kill, unlink, rmdir, _exit). */
static void on_signal(int sig) {
    if (server_pid > 0) kill(server_pid, SIGTERM);
    if (env_pid > 0) kill(env_pid, SIGTERM);
    unlink(p_c2s); unlink(p_s2c); unlink(p_e2c); unlink(p_c2e);
    if (dir[0]) rmdir(dir);
    _exit(128 + sig);
}

static pid_t spawn(char *const argv[]) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* the client killed outright (SIGKILL): its children end too */
        if (getppid() != parent) _exit(1);
#else
        (void)parent;
#endif
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
    const char *why = NULL;
    int nf = parse_header(line, sizes, &advice_size, &why);
    if (nf < 0) { fail("malformed header: %s", why); return -1; }
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
        for (int i = 0; i < nf; i++) { /* relayed in chunks: a declared size never becomes one allocation */
            static char buf[1 << 16];
            size_t left = sizes[i], send_left = k == truncate_at ? sizes[i] / 2 : sizes[i];
            while (left > 0) {
                size_t n = left < sizeof buf ? left : sizeof buf, out;
                int r = read_exact(from_env, buf, n, "feature buffer");
                if (r == 0) fail("truncated observation %ld: the env side closed mid-message", k);
                if (r <= 0) return -1;
                out = n < send_left ? n : send_left; /* the truncation test sends half a buffer */
                if (out && write_all(to_server, buf, out, "feature buffer") < 0) return -1;
                send_left -= out;
                left -= n;
            }
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
                    "                  [--policy P] [--timeout S] [--start-timeout S] [--truncate-at K]\n"
                    "       xrl_client --parse-header < HEADER_LINE   (check a header: the byte sizes it declares)\n");
}

int main(int argc, char **argv) {
    const char *python = "python3", *env_side = "clients/c/env_side.py", *graph = "mlp", *policy = NULL;
    const char *max_cand = "16", *horizon = "0", *observation = "graph", *server_module = "xrl";
    long truncate_at = -1;
    int parse_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--parse-header")) { parse_only = 1; continue; }
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
    if (parse_only) { /* --parse-header: check one header line from stdin, print the sizes (the tests' probe) */
        static char line[MAX_LINE];
        size_t sizes[MAX_FEATURES], advice_size;
        const char *why = NULL;
        if (!fgets(line, sizeof line, stdin)) return 2;
        line[strcspn(line, "\n")] = 0;
        int nf = parse_header(line, sizes, &advice_size, &why);
        if (nf < 0) { fail("malformed header: %s", why); return 2; }
        for (int i = 0; i < nf; i++) printf("%zu ", sizes[i]);
        printf("advice %zu\n", advice_size);
        return 0;
    }
    struct sigaction term;
    memset(&term, 0, sizeof term);
    term.sa_handler = on_signal;
    sigemptyset(&term.sa_mask);
    sigaddset(&term.sa_mask, SIGALRM);
    sigaction(SIGTERM, &term, NULL);
    sigaction(SIGINT, &term, NULL);
    sigaction(SIGHUP, &term, NULL);

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
