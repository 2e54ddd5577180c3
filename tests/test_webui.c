/* test_webui.c - the chat page (GET /) and GET /props of `sparq serve`,
 * checked by tests/webui/chat.test.mjs in Debian's chromium, driven
 * headless by puppeteer-core, against the API the page talks to:
 *
 *  - GET / is src/server/webui/index.html with a fresh nonce per copy,
 *    under a Content-Security-Policy naming it; /props has llama-server's
 *    fields (n_ctx, total_slots, params, model_path, chat template and
 *    whether it is the chatml fallback, build_info, modalities);
 *  - in the browser: a typed message's streamed reply equals the API's
 *    greedy answer (temperature 0) for the same conversation, over two
 *    turns, with the dense and the SparQ 1/8 policy; the tokens/s and the
 *    KV fraction under it are the API's; the conversation and settings
 *    survive a reload; an error is shown;
 *  - --api-key: the page asks for the key, refuses a wrong one, chats
 *    with the right one and keeps it.
 *
 * Two servers run here on 127.0.0.1 with free ports, every wait bounded.
 * scripts/setup.sh installs chromium and runs `npm ci` in tests/webui;
 * without them this test fails (saying so): only a missing model skips.
 * SPARQ_WEBUI_SCREENSHOT=path saves the page (docs/chat-page.png).
 */
#include "test.h"
#include "test_proc.h"
#include "util/paths.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char bin[1024];
static const char *key = "webui-test-key-42";

typedef proc_server server;

static int start_server(server *s, const char *args)
{
    const int rc = proc_server_start(s, bin, "webui", args);
    CHECK(rc == 0, "server did not start (log %s): serve %s", s->log, args);
    return rc;
}

static int stop_server(server *s) { return proc_server_stop(s); }

/* Runs the browser test; each of its "ok" / "not ok" lines is a check. */
static void browser_tests(const server *open, const server *keyed)
{
    char out[64] = "/tmp/sparq_test_webui_node_XXXXXX";
    const int fd = mkstemp(out);
    if (fd < 0) return;
    close(fd);
    char cwd[1024], cmd[4096];
    if (!getcwd(cwd, sizeof cwd)) return;
    snprintf(cmd, sizeof cmd,
             "cd tests/webui && timeout 300 node chat.test.mjs http://127.0.0.1:%d http://127.0.0.1:%d %s "
             "%s/src/server/webui/index.html >%s 2>&1",
             open->port, keyed->port, key, cwd, out);
    const int rc = system(cmd);
    size_t n;
    char *text = test_read_file(out, &n);
    unlink(out);
    int pass = 0, summary = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "ok ", 3)) pass++;
        else if (!strncmp(line, "not ok ", 7)) CHECK(0, "webui: %s", line + 7);
        else if (strstr(line, "webui: ")) summary = 1;
        else fprintf(stderr, "node: %s\n", line);
    }
    test_n_pass += pass;
    CHECK(summary && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "the browser test did not finish (exit %d)", rc);
    CHECK(pass >= 30, "the browser test ran only %d checks", pass);
    free(text);
}

int main(void)
{
    char model[1024];
    if (path_find("stories260K.gguf", model, sizeof model)) {
        test_skip("stories260K.gguf not found");
        return test_summary("test_webui");
    }
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    CHECK(access(bin, X_OK) == 0, "%s not built", bin);
    const char *chromium = getenv("CHROMIUM") ? getenv("CHROMIUM") : "/usr/bin/chromium";
    struct stat st;
    const int have_browser = access(chromium, X_OK) == 0;
    const int have_modules = stat("tests/webui/node_modules/puppeteer-core", &st) == 0;
    CHECK(have_browser, "%s is missing (scripts/setup.sh installs Debian's chromium)", chromium);
    CHECK(have_modules, "tests/webui/node_modules is missing (scripts/setup.sh runs npm ci there)");
    if (access(bin, X_OK) != 0 || !have_browser || !have_modules) return test_summary("test_webui");
    signal(SIGPIPE, SIG_IGN);

    server open, keyed;
    char args[2048];
    /* stories260K has no chat template: the chatml fallback, as /props says */
    snprintf(args, sizeof args, "-m %s -c 256 -b 4 -t 1 --parallel 2", model);
    const int ok_open = start_server(&open, args) == 0;
    snprintf(args, sizeof args, "-m %s -c 256 -b 4 -t 1 --parallel 2 --api-key %s --chat-template chatml", model, key);
    const int ok_keyed = start_server(&keyed, args) == 0;
    if (ok_open && ok_keyed) browser_tests(&open, &keyed);
    if (ok_open) CHECK(stop_server(&open) == 0, "SIGTERM did not end the open server cleanly");
    if (ok_keyed) CHECK(stop_server(&keyed) == 0, "SIGTERM did not end the keyed server cleanly");
    const int fd = ok_open ? dial(open.port) : -1;
    CHECK(!ok_open || fd < 0, "port %d still answers after the server stopped", open.port);
    if (fd >= 0) close(fd);
    return test_summary("test_webui");
}
