/* test_progress.c - `--progress` for long prompts, as a
 * user running `sparq run` / `sparq prefill` with stderr in a log file sees
 * it: whole lines with tokens done / total, tok/s and ETA, checked against
 * the command's own counts; and Ctrl-C during a long prefill stopping it
 * within one batch. Runs the binary from $SPARQ_BUILD (default build/). */
#include "test.h"
#include "util/paths.h"
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char bin[1024];
static char tmp[256]; /* mkdtemp: parallel suites never collide */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Starts `sparq argv...` with stdout and stderr into files; interval sets
 * $SPARQ_PROGRESS_SECONDS (NULL: unset, the 5 s default). */
static pid_t spawn(char *const argv[], const char *out_path, const char *err_path, const char *interval)
{
    pid_t pid = fork();
    if (pid != 0) return pid;
    int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(127);
    if (interval) setenv("SPARQ_PROGRESS_SECONDS", interval, 1);
    else unsetenv("SPARQ_PROGRESS_SECONDS");
    execv(bin, argv);
    _exit(127);
}

/* Waits up to `limit` seconds (then kills); returns the exit code, 128+sig
 * if signalled, -1 on timeout. */
static int reap(pid_t pid, double limit)
{
    const double t0 = now_s();
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (r < 0) return -1;
        if (now_s() - t0 > limit) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(2000);
    }
}

static int run_wait(char *const argv[], const char *out_path, const char *err_path, const char *interval)
{
    pid_t pid = spawn(argv, out_path, err_path, interval);
    return pid < 0 ? -1 : reap(pid, 120);
}

/* The progress lines of a stderr text. */
typedef struct prog_line { long long done, total; double rate, eta; } prog_line;

static int parse_lines(const char *s, prog_line *out, int max)
{
    int n = 0;
    for (const char *p = s; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        prog_line l;
        if (strncmp(p, "prefill: ", 9) == 0 &&
            sscanf(p, "prefill: %lld / %lld tokens, %lf tok/s, ETA %lf s", &l.done, &l.total, &l.rate, &l.eta) == 4 &&
            n < max)
            out[n++] = l;
    }
    return n;
}

/* One line per batch (interval 0): done climbs by the batch, total is the
 * prompt, the last says done = total with ETA 0, ETAs agree with the rates. */
static void check_per_batch(const char *what, const char *err, long long total, int batch)
{
    prog_line l[512];
    const int n = parse_lines(err, l, 512);
    const long long expect = (total + batch - 1) / batch;
    CHECK(n == expect, "%s: %d progress lines, expected %lld (%lld tokens / batch %d): %.300s", what, n, expect,
          total, batch, err);
    CHECK(!strchr(err, '\r'), "%s: no carriage returns in a log file", what);
    int ok = n > 0;
    for (int i = 0; i < n; i++) {
        const long long want = (i + 1) * (long long)batch < total ? (i + 1) * (long long)batch : total;
        if (l[i].done != want || l[i].total != total || !(l[i].rate > 0) || l[i].eta < 0) ok = 0;
        /* ETA printed to the second: (total - done) / rate, within rounding */
        if (l[i].rate > 0 && fabs(l[i].eta - (double)(l[i].total - l[i].done) / l[i].rate) > 0.51) ok = 0;
    }
    CHECK(ok, "%s: lines count up by %d to %lld with positive rates and consistent ETAs: %.400s", what, batch, total,
          err);
    CHECK(n > 0 && l[n - 1].done == total && l[n - 1].eta == 0, "%s: the last line is the end", what);
}

int main(void)
{
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return test_summary("test_progress");
    }
    char model[1024];
    if (path_find("stories260K.gguf", model, sizeof model)) {
        test_skip("stories260K.gguf not found");
        return test_summary("test_progress");
    }
    snprintf(tmp, sizeof tmp, "/tmp/sparq_progress_XXXXXX");
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp failed");
        return test_summary("test_progress");
    }
    char out_path[512], err_path[512], prompt[512], kv[512], tiny[512];
    snprintf(out_path, sizeof out_path, "%s/out.txt", tmp);
    snprintf(err_path, sizeof err_path, "%s/err.txt", tmp);
    snprintf(prompt, sizeof prompt, "%s/prompt.txt", tmp);
    snprintf(kv, sizeof kv, "%s/ctx.kv", tmp);
    snprintf(tiny, sizeof tiny, "%s/tiny.gguf", tmp);
    FILE *f = fopen(prompt, "w");
    for (int i = 0; f && i < 40; i++) fputs("Once upon a time there was a little dog. ", f);
    if (f) fclose(f);
    size_t sz;
    char *out, *err;

    /* sparq run --progress --json, one line per batch: the total is the
     * prompt the JSON reports */
    {
        char *argv[] = { bin, "run", "-m", model, "-f", prompt, "-c", "512", "-b", "16", "-n", "2", "--temp", "0",
                         "-t", "1", "--progress", "--json", NULL };
        int rc = run_wait(argv, out_path, err_path, "0");
        out = test_read_file(out_path, &sz);
        err = test_read_file(err_path, &sz);
        const char *pt = out ? strstr(out, "\"prompt_tokens\":[") : NULL;
        long long n_prompt = 0;
        for (const char *p = pt; p && *p && *p != ']'; p++) n_prompt += *p == ',';
        n_prompt += pt != NULL;
        CHECK(rc == 0 && pt && n_prompt > 300, "run --progress: exit %d, %lld prompt tokens", rc, n_prompt);
        if (err && n_prompt > 0) check_per_batch("run", err, n_prompt, 16);
        free(out); free(err);
    }

    /* sparq prefill --progress: the total is the summary's token count; the
     * final rate is the summary's rate (same clock, same start) */
    {
        char *argv[] = { bin, "prefill", "-m", model, "-f", prompt, "-c", "512", "-b", "32", "-t", "1", "--index",
                         "none", "--save-kv", kv, "--progress", NULL };
        int rc = run_wait(argv, out_path, err_path, "0");
        err = test_read_file(err_path, &sz);
        long long n = 0;
        double summary_rate = 0;
        const char *s = err ? strstr(err, "prefill: ") : NULL;
        while (s && sscanf(s, "prefill: %lld tokens in %*f s (%lf tok/s)", &n, &summary_rate) != 2)
            s = strstr(s + 1, "prefill: ");
        CHECK(rc == 0 && s && n > 300, "prefill --progress: exit %d: %.300s", rc, err ? err : "");
        if (err && n > 0) {
            check_per_batch("prefill", err, n, 32);
            prog_line l[64];
            int k = parse_lines(err, l, 64);
            CHECK(k > 0 && fabs(l[k - 1].rate - summary_rate) <= 0.25 * summary_rate,
                  "final rate %.1f vs summary %.1f tok/s", k > 0 ? l[k - 1].rate : 0.0, summary_rate);
        }
        free(err);

        /* the default 5 s interval on a short prefill: the first batch (it
         * has started) and the end, nothing between */
        rc = run_wait(argv, out_path, err_path, NULL);
        err = test_read_file(err_path, &sz);
        prog_line l[64];
        int k = err ? parse_lines(err, l, 64) : 0;
        CHECK(rc == 0 && k == 2 && l[0].done == 32 && l[1].done == n && l[1].total == n,
              "default interval: %d lines: %.300s", k, err ? err : "");
        free(err);

        /* without --progress a log file gets no progress at all */
        char *argv2[] = { bin, "prefill", "-m", model, "-f", prompt, "-c", "512", "-b", "32", "-t", "1", "--index",
                          "none", "--save-kv", kv, NULL };
        rc = run_wait(argv2, out_path, err_path, "0");
        err = test_read_file(err_path, &sz);
        CHECK(rc == 0 && err && parse_lines(err, l, 64) == 0 && strstr(err, "saved"),
              "no --progress: %.300s", err ? err : "");
        free(err);
    }

    /* Ctrl-C in a long prefill (a tiny model with an 8k context, batches of
     * 32): it stops within one batch. With a line per batch, at most the
     * batch in flight when the signal came (and one written while we read
     * the file) may be reported after it; nothing is saved; exit 130. */
    {
        char *gen[] = { bin, "gen-model", "--shape", "tiny", "-c", "8192", "-o", tiny, NULL };
        int rc = run_wait(gen, out_path, err_path, NULL);
        CHECK(rc == 0, "gen-model tiny: exit %d", rc);
        f = fopen(prompt, "w");
        for (int i = 0; f && i < 1350; i++) fprintf(f, "word%d ", i % 97);
        if (f) fclose(f);
        unlink(kv);
        char *argv[] = { bin, "prefill", "-m", tiny, "-f", prompt, "-b", "32", "-t", "1", "--index", "none",
                         "--save-kv", kv, "--progress", NULL };
        pid_t pid = spawn(argv, out_path, err_path, "0");
        int lines_at_signal = -1;
        double t_sig = 0;
        prog_line l[512];
        for (int i = 0; pid > 0 && i < 30000; i++) { /* wait for the third batch's line (at most 60 s) */
            err = test_read_file(err_path, &sz);
            int k = err ? parse_lines(err, l, 512) : 0;
            free(err);
            if (k >= 3) {
                kill(pid, SIGINT);
                t_sig = now_s();
                lines_at_signal = k;
                break;
            }
            if (waitpid(pid, &(int){ 0 }, WNOHANG) == pid) { pid = -1; break; }
            usleep(2000);
        }
        rc = pid > 0 ? reap(pid, 60) : -1;
        const double t_stop = now_s() - t_sig;
        err = test_read_file(err_path, &sz);
        int k = err ? parse_lines(err, l, 512) : 0;
        long long stopped = -1, total = -1;
        const char *s = err ? strstr(err, "interrupted: prefill stopped after ") : NULL;
        if (s) sscanf(s, "interrupted: prefill stopped after %lld of %lld tokens", &stopped, &total);
        CHECK(lines_at_signal >= 3 && rc == 130 && s, "SIGINT: exit %d, %d lines at the signal: %.300s", rc,
              lines_at_signal, err ? err + (sz > 300 ? sz - 300 : 0) : "");
        CHECK(k >= lines_at_signal && k - lines_at_signal <= 2 && k > 0 && stopped == l[k - 1].done &&
                  total == l[0].total && stopped < total,
              "stopped within one batch: %d lines at the signal, %d at the end, stopped at %lld of %lld", lines_at_signal,
              k, stopped, total);
        CHECK(t_stop < 10.0, "exited %.2f s after the signal (under load)", t_stop);
        struct stat st;
        CHECK(stat(kv, &st) != 0, "nothing saved after Ctrl-C");
        CHECK(err && !strstr(err, "error"), "no error line: %.300s", err ? err : "");
        free(err);
    }

    unlink(out_path);
    unlink(err_path);
    unlink(prompt);
    unlink(kv);
    unlink(tiny);
    rmdir(tmp);
    return test_summary("test_progress");
}
