/* cli_run.c - `sparq run`: prompt in, continuation out; with --chat and no
 * prompt, an interactive conversation read from stdin.
 *
 * stdout carries only the generated text (or one JSON object with --json);
 * timings, progress, the "> " prompt and errors go to stderr.
 *
 * Map:
 *   run_table        the options
 *   generate         the sampling loop both modes share
 *   prompt_ids       -p / -f / --prompt-tokens (/ --chat -p) -> token ids
 *   chat_turn_ids    the tokens one more user turn appends to the cache
 *   run_chat         the interactive loop: one user turn per stdin line
 *   run_parse, run_check   the options, checked before anything is loaded
 *   run_load, run_context, run_sampling   model and prompt, context, sampler
 *   run_prompt       one prompt: prefill, generation, timings (--json)
 *   cli_run          the steps in order; then one prompt or run_chat
 */
#include "cli/cli.h"
#include "util/err.h"
#include "util/sysmem.h"
#include "util/textbuf.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/statvfs.h>
#include <unistd.h>

typedef struct run_opts {
    const char *prompt;        /* -p */
    const char *prompt_file;   /* -f */
    const char *prompt_tokens; /* --prompt-tokens 1,2,3 */
    int         n_predict;     /* -n */
    sparq_sampler_params sp;   /* the library's defaults, then the options */
    const char *logits_out;
    int         ignore_eos;
    int         chat;          /* --chat / -cnv */
    int         no_chat;       /* -no-cnv */
    int         interactive;   /* -i: turns from stdin (-p is the first) */
    const char *chat_template;
    const char *system;
    const char *load_kv;       /* --load-kv FILE */
    const char *kv_file;       /* --kv-file FILE */
    int         verify_kv;     /* --verify-kv */
    int         kv_preload;    /* --kv-preload */
    cli_strs    reverse;       /* -r TEXT ... */
    cli_strs    logit_bias;    /* -l ID+BIAS ... */
    const char *grammar;       /* --grammar GBNF */
    const char *grammar_file;  /* --grammar-file FILE */
    const char *json_schema;   /* -j, --json-schema SCHEMA */
    int         context_shift, no_context_shift;
    int         n_keep;        /* --keep */
    int         progress;      /* --progress */
} run_opts;

#define OFF(f) offsetof(run_opts, f)
static const cli_opt run_table[] = {
    { "-p", "--prompt", OPT_STR, OFF(prompt), "TEXT", "prompt text" },
    { "-f", "--file", OPT_STR, OFF(prompt_file), "FILE", "read the prompt from FILE" },
    { "--prompt-tokens", NULL, OPT_STR, OFF(prompt_tokens), "ID,ID,...", "prompt as token ids (no BOS added)" },
    { "-n", "--n-predict", OPT_INT, OFF(n_predict), "N",
      "tokens to generate (default 128; 0: only evaluate the prompt; -1: until end of generation or the context "
      "is full, with a context shift at most -c tokens a reply)" },
    { "--temp", NULL, OPT_FLOAT, OFF(sp.temp), "T", "temperature (0 = greedy; default 0.8)" },
    { "--top-k", NULL, OPT_INT0, OFF(sp.top_k), "K", "top-k sampling (0 = off; default 40)" },
    { "--top-p", NULL, OPT_FLOAT, OFF(sp.top_p), "P", "top-p sampling (1 = off; default 0.95)" },
    { "--min-p", NULL, OPT_FLOAT, OFF(sp.min_p), "P", "min-p sampling: keep p >= P * p_max (0 = off; default 0.05)" },
    { "--repeat-penalty", NULL, OPT_FLOAT, OFF(sp.repeat_penalty), "F",
      "divide the logits of ids in the last --repeat-last-n by F (1 = off, the default)" },
    { "--repeat-last-n", NULL, OPT_INT, OFF(sp.penalty_last_n), "N",
      "ids the penalties look back at (default 64; 0 = no penalties, -1 = all)" },
    { "--presence-penalty", NULL, OPT_FLOAT, OFF(sp.presence_penalty), "F",
      "subtract F from the logit of every id in the window (0 = off, the default)" },
    { "--frequency-penalty", NULL, OPT_FLOAT, OFF(sp.frequency_penalty), "F",
      "subtract F times its count from the logit of every id in the window (0 = off, the default)" },
    { "-r", "--reverse-prompt", OPT_STRS, OFF(reverse), "TEXT",
      "stop generating when the text contains TEXT (repeatable; not printed)" },
    { "-l", "--logit-bias", OPT_STRS, OFF(logit_bias), "ID(+|-)BIAS",
      "add BIAS to the logit of token ID before sampling, as llama.cpp (-l 15043+1; -l 15043-inf bans it; repeatable, up to 16)" },
    { "--grammar", NULL, OPT_STR, OFF(grammar), "GBNF",
      "constrain the output to a grammar in llama.cpp's GBNF (start rule 'root')" },
    { "--grammar-file", NULL, OPT_STR, OFF(grammar_file), "FILE", "the same, the grammar read from FILE" },
    { "-j", "--json-schema", OPT_STR, OFF(json_schema), "SCHEMA",
      "constrain the output to JSON matching a JSON Schema ('{}': any JSON value; see docs/STRUCTURED_OUTPUT.md)" },
    { "-s", "--seed", OPT_U64, OFF(sp.seed), "N", "sampling seed (default: a random one; --json prints it)" },
    { "--logits-out", NULL, OPT_STR, OFF(logits_out), "FILE",
      "write float32 logits [n_rows][n_vocab] of every prompt position and generation step" },
    { "--ignore-eos", NULL, OPT_FLAG, OFF(ignore_eos), NULL, "do not stop at end-of-generation tokens" },
    { "--chat", "-cnv", OPT_FLAG, OFF(chat), NULL,
      "chat format: -p/-f is one user message; without them, user turns are read "
      "from stdin, one per line, until EOF (the cache is kept between turns); a model without a "
      "chat template gets chatml" },
    { "--conversation", NULL, OPT_FLAG, OFF(chat), NULL, "the same as --chat (llama-cli's spelling)" },
    { "-no-cnv", "--no-conversation", OPT_FLAG, OFF(no_chat), NULL,
      "plain text completion, no chat format (the default here)" },
    { "-i", "--interactive", OPT_FLAG, OFF(interactive), NULL,
      "interactive chat: user turns from stdin, one per line; -p, if given, is the first turn" },
    { "--chat-template", NULL, OPT_STR, OFF(chat_template), "NAME",
      "llama3 | chatml | phi3 | mistral | gemma (default: from the model)" },
    { "--system", NULL, OPT_STR, OFF(system), "TEXT", "system message; implies --chat" },
    { "-sys", "--system-prompt", OPT_STR, OFF(system), "TEXT", "the same as --system (llama-cli's spelling)" },
    { "--load-kv", NULL, OPT_STR, OFF(load_kv), "FILE",
      "start from a saved KV cache (sparq prefill --save-kv); the prompt continues it" },
    { "--kv-file", NULL, OPT_STR, OFF(kv_file), "PATH",
      "keep the KV cache in the file PATH.tmp (removed at the end) instead of memory: a context larger than "
      "RAM; chosen by itself, in $TMPDIR, when the cache would take over half of the available memory" },
    { "--kv-preload", NULL, OPT_FLAG, OFF(kv_preload), NULL,
      "read the whole --load-kv file into memory first, in one pass, when it fits (with progress; counted "
      "in load_ms): questions then read memory, not the disk at random" },
    { "--verify-kv", NULL, OPT_FLAG, OFF(verify_kv), NULL,
      "check the data checksums of --load-kv even when the file is over 1 GiB" },
    { "--context-shift", NULL, OPT_FLAG, OFF(context_shift), NULL,
      "when the cache is full, drop the oldest half after --keep and go on "
      "(the default in interactive --chat)" },
    { "--no-context-shift", NULL, OPT_FLAG, OFF(no_context_shift), NULL, "stop when the cache is full" },
    { "--keep", NULL, OPT_INT0, OFF(n_keep), "N",
      "prompt tokens a context shift never drops, after BOS (default 0)" },
    { "--progress", NULL, OPT_FLAG, OFF(progress), NULL,
      "prefill progress on stderr even when it is not a terminal: a line after the first batch, every 5 s ($SPARQ_PROGRESS_SECONDS) and at the end, with tokens done / total, tok/s and ETA" },
    { 0 },
};
#undef OFF

/* The one piece of global state: the SIGINT handler's. `interrupted`
 * counts Ctrl-Cs; `abort_now` is the context's abort flag, raised only
 * while `armed` (a run's prefill and every reply), so a Ctrl-C during a
 * chat turn's prefill lets the turn into the cache whole and then stops
 * its reply before the first token. */
static volatile sig_atomic_t interrupted, abort_now, armed;
static void on_sigint(int sig)
{
    (void)sig;
    interrupted++;
    if (armed) abort_now = 1;
}

/* SA_RESTART: an interrupted write to stdout goes on; the chat prompt
 * waits in ppoll, which a signal always interrupts. */
static void install_sigint(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}


/* Parses "1,2,3" into a malloc'ed array; returns count or -1. */
static int parse_ids(const char *s, int32_t **out)
{
    int cap = 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return -1;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX || (*end && *end != ',')) { free(ids); return -1; }
        if (n == cap) {
            int32_t *bigger = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!bigger) { free(ids); return -1; }
            ids = bigger;
        }
        ids[n++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    *out = ids;
    return n;
}

/* One -l value as llama.cpp spells it: a token id, a sign and a magnitude
 * ("15043+1", "15043-0.5", "15043-inf"). Only -inf is infinite: it bans
 * the id. Returns 0, or -1 with a message. */
static int parse_logit_bias(const char *v, int32_t *id, float *bias, char *err, size_t err_size)
{
    char *end;
    errno = 0;
    long t = v[0] >= '0' && v[0] <= '9' ? strtol(v, &end, 10) : -1;
    if (t < 0 || errno || t > INT32_MAX || (*end != '+' && *end != '-')) goto bad;
    const char sign = *end++;
    /* a magnitude: no second sign, no blanks, no NaN, no hex */
    if (!((*end >= '0' && *end <= '9') || *end == '.' || strncasecmp(end, "inf", 3) == 0)) goto bad;
    if (strncasecmp(end, "0x", 2) == 0) goto bad;
    const char *mag = end;
    errno = 0;
    double b = strtod(mag, &end);
    if (end == mag || *end || (errno == ERANGE && isinf(b))) goto bad;
    if (isinf(b) && sign == '+')
        return err_set(err, err_size, "-l %s: +inf is not a bias (-inf bans a token)", v);
    if (!isinf(b) && !isfinite((float)b))
        return err_set(err, err_size, "-l %s: the bias is too large for a float", v);
    *id = (int32_t)t;
    *bias = sign == '-' ? -(float)b : (float)b;
    return 0;
bad:
    return err_set(err, err_size, "-l '%s' must be TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 15043-inf)", v);
}

static int write_rows(FILE *f, const float *rows, size_t n_rows, int n_vocab)
{
    return fwrite(rows, sizeof(float) * (size_t)n_vocab, n_rows, f) == n_rows ? 0 : -1;
}

/* ---- generation -------------------------------------------------------- */

typedef struct gen_ctx {
    const sparq_model *m;
    sparq_context *c;
    sparq_sampler *smp;
    float      *logits;     /* [n_vocab]: the last evaluated position's     */
    int         n_vocab;
    int         ignore_eos;
    int         print;      /* stream each piece to stdout                  */
    FILE       *lf;         /* --logits-out rows, or NULL                   */
    const char *lf_path;
    const char *const *stop;/* -r strings                                   */
    int         n_stop;
    int         context_shift;
    int64_t     n_keep;
    cli_progress *progress; /* restarted before each prefill               */
    const sparq_grammar *grammar; /* --grammar: each chat reply starts it anew */
} gen_ctx;

static int print_text(void *user, const char *text, size_t n)
{
    (void)user;
    fwrite(text, 1, n, stdout);
    fflush(stdout);
    return 0;
}

static int write_logits(void *user, const float *logits, int n_vocab)
{
    const gen_ctx *g = user;
    if (write_rows(g->lf, logits, 1, n_vocab) == 0) return 0;
    fprintf(stderr, "\nerror: writing '%s' failed\n", g->lf_path);
    return -1;
}

/* The library's loop (sparq_generate) with this command's printing.
 * Returns 0, or -1 after printing the error. */
/* Why a reply stopped, for people (stderr) and --json. */
static const char *stop_text(int stop)
{
    switch (stop) {
    case SPARQ_STOP_EOG: return "end of generation";
    case SPARQ_STOP_STRING: return "reverse prompt";
    case SPARQ_STOP_CONTEXT_FULL: return "context full";
    case SPARQ_STOP_ABORTED: return "interrupted";
    }
    return sparq_stop_name(stop);
}

static int generate(const gen_ctx *g, int n_predict, sparq_generation *r)
{
    sparq_generate_params p = sparq_generate_default_params();
    p.max_tokens = n_predict;
    p.ignore_eog = g->ignore_eos;
    p.sampler = g->smp;
    p.stop = g->stop;
    p.n_stop = g->n_stop;
    p.context_shift = g->context_shift;
    p.n_keep = g->n_keep;
    p.on_text = g->print ? print_text : NULL;
    p.on_logits = g->lf ? write_logits : NULL;
    p.user = (void *)g;
    if (sparq_generate(g->c, g->logits, &p, r) == 0) return 0;
    if (sparq_context_error(g->c)[0]) fprintf(stderr, "\nerror: %s\n", sparq_context_error(g->c));
    return -1;
}

/* ---- prompts ----------------------------------------------------------- */

/* Renders and tokenizes msgs[n] (plus the assistant's opening) into a
 * malloc'ed array; returns the count or -1 after printing the error. */
static int chat_ids(const sparq_model *m, const char *tmpl, const sparq_chat_msg *msgs, int n,
                    int32_t **out)
{
    char err[512];
    int n_ids = sparq_chat_tokenize(m, tmpl, msgs, n, 1, NULL, 0, err, sizeof err);
    if (n_ids < 0) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    int32_t *ids = malloc((size_t)(n_ids + 1) * sizeof *ids);
    if (!ids || sparq_chat_tokenize(m, tmpl, msgs, n, 1, ids, n_ids, err, sizeof err) != n_ids) {
        fprintf(stderr, "error: cannot tokenize the chat prompt\n");
        free(ids);
        return -1;
    }
    *out = ids;
    return n_ids;
}

/* The prompt of a single-shot run as token ids (malloc'ed, room for one
 * more); returns the count, or -1 after printing the error. */
static int prompt_ids(const sparq_model *m, const run_opts *ro, int32_t **out)
{
    if (ro->prompt_tokens) {
        int n = parse_ids(ro->prompt_tokens, out);
        if (n <= 0) fprintf(stderr, "error: --prompt-tokens must be comma-separated token ids\n");
        return n > 0 ? n : -1;
    }
    size_t len = 0;
    char *text = NULL;
    if (ro->prompt_file) {
        if (!(text = text_read_file(ro->prompt_file, &len))) {
            fprintf(stderr, "error: cannot read prompt file '%s'\n", ro->prompt_file);
            return -1;
        }
    } else if (!(text = strdup(ro->prompt ? ro->prompt : ""))) {
        fprintf(stderr, "error: out of memory\n");
        return -1;
    } else {
        len = strlen(text);
    }
    int n;
    if (ro->chat || ro->chat_template) {
        sparq_chat_msg msgs[2] = { { "system", ro->system }, { "user", text } };
        n = ro->system ? chat_ids(m, ro->chat_template, msgs, 2, out)
                       : chat_ids(m, ro->chat_template, msgs + 1, 1, out);
    } else {
        const int bos = ro->load_kv ? 0 : 1; /* a loaded cache already began the sequence */
        n = sparq_tokenize(m, text, (int)len, bos, NULL, 0);
        if (n < 0 || !(*out = malloc((size_t)(n + 1) * sizeof **out)) ||
            sparq_tokenize(m, text, (int)len, bos, *out, n) != n) {
            fprintf(stderr, "error: cannot tokenize the prompt\n");
            n = -1;
        }
    }
    free(text);
    return n;
}

/* The tokens turn k appends to the cache. Turn 1: [system,] user and the
 * assistant's opening. Later turns: what the template writes after the
 * previous reply (its closing), the new user message and the opening -
 * the difference between rendering [prev, assistant "", user] and [prev].
 * The template's markers are special tokens, and the text between markers
 * is tokenized on its own, so the first rendering starts with the second.
 * If a vocabulary lacks the markers that may fail at the boundary; the new
 * tokens then start where the two first differ (a note says so once).
 * Returns the count (ids malloc'ed, room for one more), or -1. */
static int chat_turn_ids(const sparq_model *m, const char *tmpl, const char *system, const char *prev,
                         const char *user, int32_t **out, int *noted)
{
    sparq_chat_msg msgs[3];
    int n_msgs = 0;
    if (!prev) {
        if (system) msgs[n_msgs++] = (sparq_chat_msg){ "system", system };
        msgs[n_msgs++] = (sparq_chat_msg){ "user", user };
        return chat_ids(m, tmpl, msgs, n_msgs, out);
    }
    msgs[0] = (sparq_chat_msg){ "user", prev };
    msgs[1] = (sparq_chat_msg){ "assistant", "" };
    msgs[2] = (sparq_chat_msg){ "user", user };
    int32_t *head = NULL, *full = NULL;
    int n_head = chat_ids(m, tmpl, msgs, 1, &head);
    int n_full = n_head < 0 ? -1 : chat_ids(m, tmpl, msgs, 3, &full);
    if (n_full < 0) {
        free(head);
        return -1;
    }
    int same = 0;
    while (same < n_head && same < n_full && head[same] == full[same]) same++;
    if (same < n_head && !*noted) {
        fprintf(stderr, "note: this vocabulary splits the chat template's turn boundary differently "
                        "from turn to turn; turns are joined where the renderings agree\n");
        *noted = 1;
    }
    free(head);
    memmove(full, full + same, (size_t)(n_full - same) * sizeof *full);
    *out = full;
    return n_full - same;
}

/* ---- interactive chat ----------------------------------------------------- */

/* stdin lines for the chat prompt. SIGINT is blocked except inside ppoll,
 * so a Ctrl-C at the prompt always wakes the reader (never lost between a
 * check and a blocking read). */
typedef struct line_reader {
    char  *buf;
    size_t len, cap;
    int    eof;
} line_reader;

enum { LINE_OK = 0, LINE_EOF = -1, LINE_INTERRUPT = -2, LINE_ERROR = -3 };

/* The next line (without its newline, NUL-terminated, valid until the next
 * call) in *line; or LINE_EOF, LINE_INTERRUPT (Ctrl-C: the partial line is
 * dropped), LINE_ERROR. */
static int read_line(line_reader *r, char **line, size_t *consumed)
{
    if (*consumed) { /* drop the line handed out last time */
        memmove(r->buf, r->buf + *consumed, r->len - *consumed);
        r->len -= *consumed;
        *consumed = 0;
    }
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &old);
    sigset_t wait_mask = old;
    sigdelset(&wait_mask, SIGINT);
    int rc = LINE_ERROR;
    for (;;) {
        char *nl = r->len ? memchr(r->buf, '\n', r->len) : NULL;
        if (nl || (r->eof && r->len)) {
            size_t n = nl ? (size_t)(nl - r->buf) : r->len;
            if (nl) *nl = 0;
            else r->buf[n] = 0; /* room: cap > len always */
            *consumed = nl ? n + 1 : n;
            *line = r->buf;
            rc = LINE_OK;
            break;
        }
        if (r->eof) { rc = LINE_EOF; break; }
        if (interrupted) {
            r->len = 0; /* the line typed so far is cleared */
            rc = LINE_INTERRUPT;
            break;
        }
        struct pollfd pfd = { 0, POLLIN, 0 };
        int pr = ppoll(&pfd, 1, NULL, &wait_mask);
        if (pr < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (r->cap - r->len < 4097) {
            size_t cap = r->cap ? r->cap * 2 : 8192;
            char *bigger = realloc(r->buf, cap);
            if (!bigger) break;
            r->buf = bigger;
            r->cap = cap;
        }
        ssize_t got = read(0, r->buf + r->len, 4096);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) break;
        if (got == 0) r->eof = 1;
        r->len += (size_t)got;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* Room for n more positions: with context shift, drops the oldest half
 * after the kept tokens (more if n needs it). Returns 0, or -1 after
 * printing the error. */
static int make_room(sparq_context *c, int64_t n, int shift, int64_t n_keep, int turn)
{
    const int64_t pos = sparq_context_pos(c), n_ctx = sparq_context_n_ctx(c);
    if (pos + n <= n_ctx) return 0;
    if (!shift || n > n_ctx - n_keep - 1) {
        fprintf(stderr, "error: turn %d needs %lld positions but the context has %lld of %lld left (-c%s)\n", turn,
                (long long)n, (long long)(n_ctx - pos), (long long)n_ctx, shift ? "" : "; or --context-shift");
        return -1;
    }
    int64_t drop = (pos - n_keep) / 2;
    if (drop < pos + n - n_ctx) drop = pos + n - n_ctx;
    if (sparq_context_shift(c, n_keep, drop)) {
        fprintf(stderr, "error: %s\n", sparq_context_error(c));
        return -1;
    }
    fprintf(stderr, "context shift: dropped %lld positions after the first %lld\n", (long long)drop, (long long)n_keep);
    return 0;
}

/* Reads user turns from stdin until EOF, one per line (blank lines are
 * skipped), and answers each: only the turn's new tokens are evaluated, the
 * cache keeps the conversation. Ctrl-C during a reply ends the reply; at
 * the prompt the first clears the line and a second in a row ends the
 * chat (as Ctrl-D does). Returns the exit code. */
static int run_chat(const gen_ctx *g, const run_opts *ro)
{
    char *line = NULL, *prev = NULL;
    size_t consumed = 0;
    line_reader lr = { 0 };
    int32_t *ids = NULL, pending_id = -1;
    int turn = 0, noted = 0, rc = 1, total_gen = 0, cleared = 0;
    double t_prefill = 0, t_decode = 0;
    int64_t n_prefilled = 0, n_decoded = 0;
    const int tty = isatty(0);
    /* -i -p TEXT: TEXT is the first turn, as llama-cli's prompt is */
    char *first = ro->prompt ? strdup(ro->prompt) : NULL;
    if (ro->prompt && !first) {
        fprintf(stderr, "error: out of memory\n");
        return 1;
    }
    for (int use_first = first != NULL;; use_first = 0) {
        int lrc = LINE_OK;
        if (use_first) {
            line = first;
        } else {
            if (tty) { fputs("> ", stderr); fflush(stderr); }
            lrc = read_line(&lr, &line, &consumed);
        }
        if (lrc == LINE_INTERRUPT) {
            if (cleared) break; /* the second Ctrl-C in a row */
            cleared = 1;
            interrupted = 0;
            fputs(tty ? "\n" : "^C (once more to quit)\n", stderr);
            continue;
        }
        if (lrc == LINE_ERROR) {
            fprintf(stderr, "error: reading stdin failed\n");
            goto done;
        }
        if (lrc == LINE_EOF) break;
        cleared = 0;
        size_t len = strlen(line);
        while (len > 0 && line[len - 1] == '\r') line[--len] = 0;
        if (strspn(line, " \t") == len) continue;
        turn++;
        int n = chat_turn_ids(g->m, ro->chat_template, ro->system, prev, line, &ids, &noted);
        if (n < 0) goto done;
        if (pending_id >= 0) { /* the previous reply's last token joins the cache first */
            memmove(ids + 1, ids, (size_t)n * sizeof *ids);
            ids[0] = pending_id;
            n++;
        }
        if (make_room(g->c, n, g->context_shift, g->n_keep, turn)) goto done;
        double t0 = cli_now();
        abort_now = 0;
        armed = 0; /* the turn goes into the cache whole */
        cli_progress_start(g->progress);
        if (sparq_eval(g->c, ids, n, g->logits)) {
            fprintf(stderr, "error: %s\n", sparq_context_error(g->c));
            goto done;
        }
        for (int i = 0; i < n && g->smp; i++) sparq_sampler_accept(g->smp, ids[i]);
        char gerr[160];
        if (g->grammar && g->smp && sparq_sampler_set_grammar(g->smp, g->m, g->grammar, gerr, sizeof gerr)) {
            fprintf(stderr, "error: %s\n", gerr);
            goto done;
        }
        double t1 = cli_now();
        sparq_generation r;
        if (interrupted) abort_now = 1; /* Ctrl-C during the prefill: no reply */
        armed = 1;
        int grc = generate(g, ro->n_predict < 0 ? (int)sparq_context_n_ctx(g->c) : ro->n_predict, &r);
        armed = 0;
        interrupted = 0; /* the Ctrl-C that ended the reply is spent; one from now on is at the prompt */
        if (grc) goto done;
        double t2 = cli_now();
        fputc('\n', stdout);
        fflush(stdout);
        total_gen += r.n_tokens;
        t_prefill += t1 - t0;
        t_decode += t2 - t1;
        n_prefilled += n;
        n_decoded += r.n_decoded;
        if (r.stop != SPARQ_STOP_EOG && r.stop != SPARQ_STOP_MAX_TOKENS) fprintf(stderr, "stopped: %s\n", stop_text(r.stop));
        fprintf(stderr, "turn %d: prefill %d tokens, %.1f tok/s | generated %d tokens, %.2f tok/s | cache %lld / %lld\n",
                turn, n, t1 > t0 ? n / (t1 - t0) : 0.0, r.n_tokens,
                t2 > t1 && r.n_decoded > 0 ? r.n_decoded / (t2 - t1) : 0.0,
                (long long)sparq_context_pos(g->c), (long long)sparq_context_n_ctx(g->c));
        pending_id = r.pending ? r.tokens[r.n_tokens - 1] : -1;
        sparq_generation_free(&r);
        free(ids);
        ids = NULL;
        free(prev);
        if (!(prev = strdup(line))) { /* the next turn renders after this message */
            fprintf(stderr, "error: out of memory\n");
            goto done;
        }
    }
    fprintf(stderr, "chat: %d turns, %d tokens generated, cache %lld / %lld | prefill %.1f tok/s, decode %.2f tok/s "
                    "| peak RSS %.1f MiB\n", turn, total_gen,
            (long long)sparq_context_pos(g->c), (long long)sparq_context_n_ctx(g->c),
            t_prefill > 0 ? n_prefilled / t_prefill : 0.0, t_decode > 0 ? n_decoded / t_decode : 0.0,
            cli_peak_rss() / 1048576.0);
    rc = 0;
done:
    free(ids);
    free(lr.buf);
    free(prev);
    free(first);
    return rc;
}

/* ---- the command -------------------------------------------------------- */

/* Prints the attention-transfer summary; returns the ratio to dense and
 * fills *out if given. */
static double attn_summary(const sparq_context *c, const sparq_attn_params *ap, sparq_attn_stats *out)
{
    sparq_attn_stats st;
    sparq_context_attn_stats(c, &st);
    double ratio = st.dense_elements > 0 ? (double)st.elements / (double)st.dense_elements : 1.0;
    fprintf(stderr, "attention %s: %lld elements read+written over %lld decode steps, %.4f of dense\n",
            ap->policy ? ap->policy : "dense", (long long)st.elements, (long long)st.steps, ratio);
    if (st.nominal_elements > 0)
        fprintf(stderr, "attention %s: %lld of those elements are nominal (an hnsw search's reads are "
                "estimated: Faiss reports no visits), the rest counted\n",
                ap->policy ? ap->policy : "dense", (long long)st.nominal_elements);
    if (st.recall_total > 0)
        fprintf(stderr, "topk: recall@k vs exact top-k %.4f (%lld / %lld), index build/load %.2f s\n",
                (double)st.recall_hits / (double)st.recall_total, (long long)st.recall_hits,
                (long long)st.recall_total, st.index_seconds);
    if (out) *out = st;
    return ratio;
}

/* Where the cache lives: --kv-file, or a file of its own in $TMPDIR when
 * it would take over half of the available memory (said once), or NULL
 * (memory). Interactive chat has no prompt to size the file by. */
static const char *run_kv_file(const run_opts *ro, const sparq_model *m, const sparq_context_params *cp,
                               int interactive, int n_prompt, char *buf, size_t size)
{
    if (interactive || n_prompt < 1) return NULL;
    if (ro->kv_file) return ro->kv_file;
    const int d = sparq_model_head_dim(m);
    const double row = cp->kv_type == SPARQ_KV_F32 ? 4.0 * d : cp->kv_type == SPARQ_KV_Q8_0 ? (d + 31) / 32 * 34.0
                                                                                            : 2.0 * d;
    const double bytes = 2.0 * row * sparq_model_n_layer(m) * sparq_model_n_kv_head(m) * (double)cp->n_ctx;
    const int64_t avail = sysmem_available();
    if (avail <= 0 || bytes <= 0.5 * (double)avail) return NULL;
    const char *dir = getenv("TMPDIR");
    /* a cache the disk cannot hold either stays a memory question: the
     * context's own checks then say what is wrong with -c */
    struct statvfs vf;
    if (statvfs(dir && *dir ? dir : "/tmp", &vf) != 0 || bytes > (double)vf.f_bavail * vf.f_frsize) return NULL;
    snprintf(buf, size, "%s/sparq-kv-%ld.kv", dir && *dir ? dir : "/tmp", (long)getpid());
    fprintf(stderr, "note: the KV cache (%.1f GiB for -c %lld) would take over half of the available memory; "
                    "it lives in %s.tmp (removed at the end; --kv-file PATH chooses the place)\n",
            bytes / 1073741824.0, (long long)cp->n_ctx, buf);
    return buf;
}

/* Everything the options say, parsed and checked. */
typedef struct run_args {
    cli_model_opts  mo;
    cli_compat_opts co;
    attn_opts       ao;
    run_opts        ro;
    cli_prefill_opts pfo;
    int     kv_type;          /* SPARQ_KV_* of --kv-type / -ctk / -ctv     */
    int     interactive;      /* turns from stdin                          */
    int32_t bias_id[CLI_STRS_MAX];
    float   bias_val[CLI_STRS_MAX];
} run_args;

/* What one run holds, released by run_free. */
typedef struct run_state {
    run_args   *a;
    char        path[4096];   /* the model file                            */
    char        kv_auto[4096];/* the cache's file when chosen by size      */
    sparq_model *m;
    sparq_context *c;
    sparq_sampler *smp;
    sparq_grammar *grammar;
    int32_t    *ids;          /* the prompt [n_prompt]                     */
    int         n_prompt, n_vocab;
    float      *logits;       /* [max(n_prompt, 1)][n_vocab]               */
    FILE       *lf;           /* --logits-out                              */
    sparq_context_params cp;
    cli_progress prog;
    double      t_load;       /* seconds: the model, and --load-kv         */
    int         shift;        /* context shift on                          */
    int64_t     n_keep;
} run_state;

/* Parses the options into *a. Returns -1 to go on, else the exit status. */
static int run_parse(int argc, char **argv, run_args *a)
{
    memset(a, 0, sizeof *a);
    attn_opts_init(&a->ao);
    a->ro.n_predict = 128;
    a->ro.sp = sparq_sampler_default_params();
    cli_group groups[] = {
        { "generation", run_table, &a->ro },
        { "model", cli_model_table, &a->mo },
        { "attention", cli_attn_table, &a->ao },
        { "prefill attention", cli_prefill_table, &a->pfo },
        { "llama-cli options accepted (docs/CLI.md)", cli_compat_table, &a->co },
    };
    return cli_parse_command(groups, 5, argc, argv,
                             "usage: sparq run [-m MODEL] (-p TEXT | -f FILE | --prompt-tokens IDS) [options]\n"
                             "       sparq run [-m MODEL] --chat [options] < turns.txt   (interactive)\n"
                             "       sparq -m MODEL -p TEXT [options]                     (the same: run is the default)",
                             NULL, 0, NULL);
}

/* The options that exclude each other and the values that cannot be
 * (before anything is loaded). Returns -1 to go on, else the exit status. */
static int run_check(run_args *a)
{
    run_opts *ro = &a->ro;
    char err[512];
    if ((a->kv_type = cli_model_kv_type(&a->mo, err, sizeof err)) < 0) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    if (ro->n_predict < -1) {
        fprintf(stderr, "error: -n %d: give N >= 0, or -1 for until end of generation or a full context\n",
                ro->n_predict);
        return 2;
    }
    if (ro->no_chat && (ro->chat || ro->interactive || ro->system)) {
        fprintf(stderr, "error: -no-cnv cannot be combined with %s\n",
                ro->chat ? "--chat/-cnv" : ro->interactive ? "-i" : "--system/-sys");
        return 2;
    }
    if (ro->interactive && (ro->prompt_file || ro->prompt_tokens)) {
        fprintf(stderr, "error: -i reads the turns from stdin (-p may give the first); not with %s\n",
                ro->prompt_file ? "-f" : "--prompt-tokens");
        return 2;
    }
    if (ro->system || ro->interactive) ro->chat = 1; /* a system message or turns need the chat format */
    cli_compat_apply(&a->co, &a->mo);
    if (!!ro->prompt + !!ro->prompt_file + !!ro->prompt_tokens > 1) {
        fprintf(stderr, "error: give only one of -p, -f and --prompt-tokens\n");
        return 2;
    }
    if (sparq_sampler_check(&ro->sp, err, sizeof err) || /* NaN or negative: never a silent default */
        cli_attn_check_policy(&a->ao, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    if (ro->context_shift && ro->no_context_shift) {
        fprintf(stderr, "error: give only one of --context-shift and --no-context-shift\n");
        return 2;
    }
    for (int i = 0; i < ro->logit_bias.n; i++)
        if (parse_logit_bias(ro->logit_bias.v[i], &a->bias_id[i], &a->bias_val[i], err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            return 2;
        }
    for (int i = 0; i < ro->reverse.n; i++)
        if (!ro->reverse.v[i][0]) {
            fprintf(stderr, "error: -r needs a non-empty text\n");
            return 2;
        }
    if (ro->prompt_file && cli_check_regular(ro->prompt_file)) return 1;
    if (ro->load_kv && cli_check_regular(ro->load_kv)) return 1;
    a->interactive = ro->interactive || (ro->chat && !ro->prompt && !ro->prompt_file && !ro->prompt_tokens);
    if (a->interactive && (a->mo.json || ro->logits_out || ro->load_kv)) {
        fprintf(stderr, "error: interactive chat (-i, or --chat without -p/-f) cannot be combined with %s\n",
                a->mo.json ? "--json" : ro->logits_out ? "--logits-out" : "--load-kv");
        return 2;
    }
    return -1;
}

/* The model, its chat template and the prompt's token ids (interactive
 * turns come later). 0, or -1 with the error printed. */
static int run_load(run_state *st)
{
    run_opts *ro = &st->a->ro;
    const double t_load0 = cli_now();
    st->m = cli_load_model(&st->a->mo, st->path, sizeof st->path);
    if (!st->m) return -1;
    st->t_load = cli_now() - t_load0;
    st->n_vocab = sparq_model_n_vocab(st->m);
    if (ro->chat) ro->chat_template = cli_chat_template(st->m, ro->chat_template);
    if (st->a->interactive) return 0;
    st->n_prompt = prompt_ids(st->m, ro, &st->ids);
    if (st->n_prompt < 0) return -1;
    if (st->n_prompt == 0) {
        fprintf(stderr, "error: the prompt is empty and the model adds no BOS token\n");
        return -1;
    }
    for (int i = 0; i < st->n_prompt; i++)
        if (st->ids[i] < 0 || st->ids[i] >= st->n_vocab) {
            fprintf(stderr, "error: prompt token %d is outside the vocabulary [0, %d)\n", st->ids[i], st->n_vocab);
            return -1;
        }
    return 0;
}

/* --load-kv: the saved cache (read in first with --kv-preload), mapped as
 * the context. 0, or -1 with the error printed. */
static int run_load_kv(run_state *st)
{
    const run_opts *ro = &st->a->ro;
    char err[512];
    double tl = cli_now();
    if (ro->kv_preload) {
        cli_progress rp;
        cli_progress_start(&rp);
        const int pr = sparq_kv_preload(ro->load_kv, cli_read_progress, &rp, err, sizeof err);
        if (pr < 0) {
            fprintf(stderr, "error: --kv-preload: %s\n", err);
            return -1;
        }
        if (pr > 0) fprintf(stderr, "warning: --kv-preload: %s\n", err);
        else fprintf(stderr, "preloaded %s (%.2f s)\n", ro->load_kv, cli_now() - tl);
    }
    const double tm = cli_now(); /* the mapping alone, apart from the preload */
    if (sparq_context_load_kv(st->m, &st->cp, ro->load_kv, ro->verify_kv ? SPARQ_VERIFY_ALWAYS : SPARQ_VERIFY_AUTO,
                              &st->c, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    fprintf(stderr, "loaded %s: %lld cached positions, capacity %lld (%.2f s)\n", ro->load_kv,
            (long long)sparq_context_pos(st->c), (long long)sparq_context_n_ctx(st->c), cli_now() - tm);
    st->t_load += cli_now() - tl;
    if (sparq_context_pos(st->c) + st->n_prompt > sparq_context_n_ctx(st->c)) {
        fprintf(stderr, "error: the prompt has %d tokens but the loaded cache has room for %lld more\n",
                st->n_prompt, (long long)(sparq_context_n_ctx(st->c) - sparq_context_pos(st->c)));
        return -1;
    }
    return 0;
}

/* The context: its parameters, the Ctrl-C handler, then a loaded cache,
 * a cache in a file or one in memory. 0, or -1 with the error printed. */
static int run_context(run_state *st)
{
    const run_args *a = st->a;
    const run_opts *ro = &a->ro;
    sparq_context_params *cp = &st->cp;
    char err[512];
    *cp = sparq_context_default_params();
    cp->n_ctx = a->mo.n_ctx > 0 ? a->mo.n_ctx : ro->load_kv ? 0 : sparq_model_n_ctx_train(st->m);
    cp->n_threads = a->mo.n_threads;
    cp->n_batch = a->mo.n_batch;
    cp->kv_type = a->kv_type;
    if (cli_prefill_params(&a->pfo, &cp->prefill, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    if (!ro->load_kv && st->n_prompt > cp->n_ctx) {
        fprintf(stderr, "error: the prompt has %d tokens but the context holds %lld (-c)\n", st->n_prompt,
                (long long)cp->n_ctx);
        return -1;
    }
    if (attn_opts_params(&a->ao, cp->n_ctx > 0 ? cp->n_ctx : sparq_model_n_ctx_train(st->m),
                         sparq_model_head_dim(st->m), &cp->attn, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    cli_progress_start(&st->prog);
    if (isatty(2) || ro->progress) {
        cp->progress = cli_prefill_progress;
        cp->progress_user = &st->prog;
    }
    cp->abort_flag = &abort_now;
    install_sigint(); /* before the long parts: a Ctrl-C from here on is handled */
    armed = 1;
    const char *kv_path = NULL;
    if (ro->load_kv) {
        if (run_load_kv(st)) return -1;
    } else if ((kv_path = run_kv_file(ro, st->m, cp, a->interactive, st->n_prompt, st->kv_auto,
                                      sizeof st->kv_auto))) {
        /* the cache in a file: its pages, not private memory, hold it; the
         * file is never finished, so freeing the context removes it */
        if (sparq_context_create_in_file(st->m, cp, kv_path, st->ids, st->n_prompt, "", 0, &st->c, err,
                                         sizeof err)) {
            fprintf(stderr, "error: --kv-file: %s\n", err);
            return -1;
        }
    } else if (sparq_context_create(st->m, cp, &st->c, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    if (a->co.verbose)
        fprintf(stderr, "verbose: model %s | context %lld | threads %d | batch %d | KV %s | attention %s | %s\n",
                st->path, (long long)sparq_context_n_ctx(st->c), sparq_context_n_threads(st->c),
                sparq_context_n_batch(st->c),
                a->kv_type == SPARQ_KV_F32 ? "f32" : a->kv_type == SPARQ_KV_Q8_0 ? "q8_0" : "f16",
                cp->attn.policy ? cp->attn.policy : "dense",
                !ro->chat ? "no chat format" : ro->chat_template ? ro->chat_template : "the model's chat template");
    return 0;
}

/* --grammar, --grammar-file or --json-schema on the sampler. Returns -1
 * to go on, else the exit status (the error printed). */
static int run_grammar(run_state *st)
{
    const run_opts *ro = &st->a->ro;
    char err[512];
    if (!!ro->grammar + !!ro->grammar_file + !!ro->json_schema > 1) {
        fprintf(stderr, "error: give at most one of --grammar, --grammar-file and --json-schema\n");
        return 2;
    }
    if (!ro->grammar && !ro->grammar_file && !ro->json_schema) return -1;
    char *text = NULL;
    size_t text_len = 0;
    if (ro->grammar_file && !(text = text_read_file(ro->grammar_file, &text_len))) {
        fprintf(stderr, "error: cannot read the grammar file '%s'\n", ro->grammar_file);
        return 2;
    }
    st->grammar = ro->json_schema ? sparq_grammar_from_json_schema(ro->json_schema, err, sizeof err)
                                  : sparq_grammar_parse(text ? text : ro->grammar, err, sizeof err);
    free(text);
    if (!st->grammar || sparq_sampler_set_grammar(st->smp, st->m, st->grammar, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    return -1;
}

/* The sampler (penalties see the prompt, -l, the grammar), the logits,
 * --logits-out and the context shift's --keep. Returns -1 to go on, else
 * the exit status (the error printed). */
static int run_sampling(run_state *st)
{
    const run_args *a = st->a;
    const run_opts *ro = &a->ro;
    char err[512];
    st->smp = sparq_sampler_create(&ro->sp, st->n_vocab);
    for (int i = 0; st->smp && i < st->n_prompt; i++) sparq_sampler_accept(st->smp, st->ids[i]);
    st->logits = malloc((size_t)(st->n_prompt > 0 ? st->n_prompt : 1) * st->n_vocab * sizeof(float));
    if (!st->smp || !st->logits) {
        fprintf(stderr, "error: out of memory\n");
        return 1;
    }
    if (sparq_sampler_set_logit_bias(st->smp, a->bias_id, a->bias_val, ro->logit_bias.n, err, sizeof err)) {
        fprintf(stderr, "error: -l: %s\n", err); /* an id outside this model's vocabulary: a usage error */
        return 2;
    }
    const int g = run_grammar(st);
    if (g >= 0) return g;
    if (ro->logits_out && !(st->lf = fopen(ro->logits_out, "wb"))) {
        fprintf(stderr, "error: cannot write '%s'\n", ro->logits_out);
        return 1;
    }
    /* context shift: on by default in interactive chat (as llama-cli);
     * --keep counts after the BOS the model adds, which is always kept */
    st->shift = ro->context_shift || (a->interactive && !ro->no_context_shift);
    st->n_keep = (int64_t)ro->n_keep + (sparq_token_bos(st->m) >= 0 && !ro->load_kv && !ro->prompt_tokens ? 1 : 0);
    if (st->shift && st->n_keep >= sparq_context_n_ctx(st->c) - 1) {
        fprintf(stderr, "error: --keep %d leaves no room to shift a context of %lld\n", ro->n_keep,
                (long long)sparq_context_n_ctx(st->c));
        return 1;
    }
    return -1;
}

/* The result of one prompt as one JSON object on stdout (--json). */
static void run_print_json(const run_state *st, const sparq_generation *r, double t_prefill, double t_decode,
                           int64_t rss, const sparq_attn_stats *at, double ratio)
{
    const sparq_context *c = st->c;
    const sparq_attn_params *ap = &st->cp.attn;
    const double prefill_tps = t_prefill > 0 ? st->n_prompt / t_prefill : 0;
    const double decode_tps = t_decode > 0 && r->n_decoded > 0 ? r->n_decoded / t_decode : 0;
    printf("{\"model\":");
    cli_json_str(stdout, st->path, strlen(st->path));
    printf(",\"prompt_tokens\":[");
    for (int i = 0; i < st->n_prompt; i++) printf("%s%d", i ? "," : "", st->ids[i]);
    printf("],\"tokens\":[");
    for (int i = 0; i < r->n_tokens; i++) printf("%s%d", i ? "," : "", r->tokens[i]);
    printf("],\"text\":");
    cli_json_str(stdout, r->text ? r->text : "", r->n_text);
    printf(",\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f,\"peak_rss_bytes\":%lld", prefill_tps, decode_tps,
           (long long)rss);
    printf(",\"n_ctx\":%lld,\"threads\":%d,\"n_batch\":%d,\"load_ms\":%.3f,\"prefill_ms\":%.3f,"
           "\"decode_ms\":%.3f,\"seed\":%llu,\"context_shifts\":%d",
           (long long)sparq_context_n_ctx(c), sparq_context_n_threads(c), sparq_context_n_batch(c), st->t_load * 1e3,
           t_prefill * 1e3, t_decode * 1e3, (unsigned long long)sparq_sampler_seed(st->smp), r->n_shifts);
    printf(",\"attn\":{\"policy\":\"%s\",\"elements\":%lld,\"dense_elements\":%lld,"
           "\"formula_elements\":%lld,\"nominal_elements\":%lld,\"transfer_counted\":%s,"
           "\"ratio\":%.6f,\"r\":%d,\"k\":%d,\"l\":%d}",
           ap->policy ? ap->policy : "dense", (long long)at->elements, (long long)at->dense_elements,
           (long long)at->formula_elements, (long long)at->nominal_elements,
           at->nominal_elements > 0 ? "false" : "true", ratio, ap->r, ap->k, ap->l);
    if (at->recall_total > 0)
        printf(",\"recall_at_k\":%.6f,\"recall_hits\":%lld,\"recall_total\":%lld",
               (double)at->recall_hits / (double)at->recall_total, (long long)at->recall_hits,
               (long long)at->recall_total);
    printf(",\"index_s\":%.4f", at->index_seconds);
    printf(",\"stop\":");
    const char *why = r->stop == SPARQ_STOP_MAX_TOKENS ? "n_predict" : stop_text(r->stop);
    cli_json_str(stdout, why, strlen(why));
    printf("}\n");
}

/* The prompt's prefill (every position's logits with --logits-out). 0,
 * 130 after a Ctrl-C (what was done printed), or 1 with the error. */
static int run_prefill(run_state *st, double *t_prefill)
{
    cli_progress_start(&st->prog);
    const int n_prompt = st->n_prompt, n_vocab = st->n_vocab;
    double t0 = cli_now();
    int ok = st->lf ? sparq_eval_all(st->c, st->ids, n_prompt, st->logits)
                    : sparq_eval(st->c, st->ids, n_prompt, st->logits);
    *t_prefill = cli_now() - t0;
    if (ok != 0 && abort_now) { /* Ctrl-C: a clean line and what was done */
        const int64_t done_pos = sparq_context_pos(st->c);
        fprintf(stderr, "%sinterrupted: prefill stopped after %lld of %d prompt tokens (%.1f tok/s, %.0f ms) | "
                        "load %.0f ms | peak RSS %.1f MiB\n", st->prog.tty ? "\n" : "", (long long)done_pos, n_prompt,
                *t_prefill > 0 ? done_pos / *t_prefill : 0.0, *t_prefill * 1e3, st->t_load * 1e3,
                cli_peak_rss() / 1048576.0);
        return 130;
    }
    if (ok != 0) {
        fprintf(stderr, "error: %s\n", sparq_context_error(st->c));
        return 1;
    }
    const float *last = st->lf ? st->logits + (size_t)(n_prompt - 1) * n_vocab : st->logits;
    if (st->lf && write_rows(st->lf, st->logits, (size_t)n_prompt, n_vocab)) {
        fprintf(stderr, "error: writing '%s' failed\n", st->a->ro.logits_out);
        return 1;
    }
    if (st->lf) memmove(st->logits, last, (size_t)n_vocab * sizeof(float));
    return 0;
}

/* One prompt: prefill, generation, the timings (and --json). Returns the
 * exit status. */
static int run_prompt(run_state *st, const gen_ctx *g)
{
    const run_args *a = st->a;
    sparq_context *c = st->c;
    double t_prefill = 0;
    int rc = run_prefill(st, &t_prefill);
    if (rc) return rc;
    double t1 = cli_now();
    /* -n -1: until the end of generation or a full cache; the bound lets
     * the loop see the cache full rather than stop one token before */
    int n_predict = a->ro.n_predict;
    if (n_predict < 0) {
        const int64_t room = sparq_context_n_ctx(c) - sparq_context_pos(c) + 2;
        n_predict = st->shift ? (int)sparq_context_n_ctx(c) : room < INT32_MAX ? (int)room : INT32_MAX - 1;
    }
    sparq_generation r = { 0 };
    if (generate(g, n_predict, &r)) {
        sparq_generation_free(&r);
        return 1;
    }
    double t_decode = cli_now() - t1;
    if (!a->mo.json) {
        /* flushed now: when stdout and stderr share a pipe, the text's
         * line must end before the timing lines */
        fputc('\n', stdout);
        fflush(stdout);
    }
    double prefill_tps = t_prefill > 0 ? st->n_prompt / t_prefill : 0;
    double decode_tps = t_decode > 0 && r.n_decoded > 0 ? r.n_decoded / t_decode : 0;
    int64_t rss = cli_peak_rss();
    if (r.stop != SPARQ_STOP_MAX_TOKENS) fprintf(stderr, "stopped: %s\n", stop_text(r.stop));
    fprintf(stderr, "prompt %d tokens, prefill %.1f tok/s | generated %d tokens, decode %.2f tok/s | peak RSS %.1f MiB\n",
            st->n_prompt, prefill_tps, r.n_tokens, decode_tps, rss / 1048576.0);
    sparq_attn_stats at;
    double ratio = attn_summary(c, &st->cp.attn, &at);
    if (a->mo.json) run_print_json(st, &r, t_prefill, t_decode, rss, &at, ratio);
    rc = r.stop == SPARQ_STOP_ABORTED ? 130 : 0;
    sparq_generation_free(&r);
    return rc;
}

/* Releases what st holds; a failed --logits-out close turns rc 0 into 1. */
static int run_free(run_state *st, int rc)
{
    if (st->lf && fclose(st->lf) != 0 && rc == 0) {
        fprintf(stderr, "error: writing '%s' failed\n", st->a->ro.logits_out);
        rc = 1;
    }
    free(st->logits);
    free(st->ids);
    sparq_sampler_free(st->smp);
    sparq_grammar_free(st->grammar);
    sparq_context_free(st->c);
    sparq_model_free(st->m);
    return rc;
}

int cli_run(int argc, char **argv)
{
    run_args a;
    int rc = run_parse(argc, argv, &a);
    if (rc < 0) rc = run_check(&a);
    if (rc >= 0) return rc;
    run_state st;
    memset(&st, 0, sizeof st);
    st.a = &a;
    rc = 1;
    if (run_load(&st) || run_context(&st)) return run_free(&st, rc);
    const int s = run_sampling(&st);
    if (s >= 0) return run_free(&st, s);
    gen_ctx g = { st.m, st.c, st.smp, st.logits, st.n_vocab, a.ro.ignore_eos, !a.mo.json, st.lf, a.ro.logits_out,
                  a.ro.reverse.v, a.ro.reverse.n, st.shift, st.n_keep, &st.prog, st.grammar };
    if (a.interactive) {
        rc = run_chat(&g, &a.ro);
        attn_summary(st.c, &st.cp.attn, NULL);
    } else {
        rc = run_prompt(&st, &g);
    }
    return run_free(&st, rc);
}
