/* test_layers.c - the source tree keeps its layering (src/README.md).
 *
 * Reads every file under src/LAYER/ and checks each `#include "..."`:
 *   - it names a header with its folder ("attn/attn.h"), or the public
 *     "sparq.h"/"sparq_attn.h", or a file of the same folder;
 *   - the named header exists;
 *   - its layer is not above the including file's layer;
 *   - the project headers' include graph has no cycle.
 * The layer order is written here a second time, on purpose: a change to it
 * must be made in src/README.md and here, not slip in with an include.
 */
#include "test.h"

#include <dirent.h>
#include <sys/stat.h>

static const struct { const char *dir; int rank; } layers[] = {
    { "util", 0 }, { "tensor", 1 }, { "index", 2 }, { "attn", 3 }, { "io", 4 },
    { "core", 5 }, { "eval", 6 },   { "bench", 6 }, { "cli", 7 },  { "server", 7 },
};
enum { N_LAYERS = sizeof layers / sizeof layers[0] };

static int layer_rank(const char *dir)
{
    for (int i = 0; i < N_LAYERS; i++)
        if (!strcmp(layers[i].dir, dir)) return layers[i].rank;
    return -1;
}

/* headers seen, for the cycle check: name "dir/file.h" and its includes */
enum { MAX_HDR = 256, MAX_INC = 32 };
typedef struct { char name[128]; char inc[MAX_INC][128]; int n_inc; int mark; } header;
static header hdrs[MAX_HDR];
static int n_hdrs;

static header *header_get(const char *name)
{
    for (int i = 0; i < n_hdrs; i++)
        if (!strcmp(hdrs[i].name, name)) return &hdrs[i];
    if (n_hdrs == MAX_HDR) return NULL;
    header *h = &hdrs[n_hdrs++];
    snprintf(h->name, sizeof h->name, "%s", name);
    return h;
}

static void check_file(const char *src, const char *dir, const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%.200s/%.60s/%.200s", src, dir, file);
    size_t n;
    char *text = test_read_file(path, &n);
    CHECK(text != NULL, "cannot read %s", path);
    if (!text) return;
    const int rank = layer_rank(dir);
    const size_t len = strlen(file);
    header *self = NULL;
    if (len > 2 && !strcmp(file + len - 2, ".h")) {
        char name[128];
        snprintf(name, sizeof name, "%.60s/%.60s", dir, file);
        self = header_get(name);
    }
    for (char *line = text; line && *line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = 0;
        char inc[128];
        if (sscanf(line, " #include \"%127[^\"]\"", inc) == 1) {
            if (!strcmp(inc, "sparq.h") || !strcmp(inc, "sparq_attn.h")) {
                line = next;
                continue;
            }
            char idir[64] = "", ifile[128] = "";
            const char *slash = strchr(inc, '/');
            if (slash) {
                snprintf(idir, sizeof idir, "%.*s", (int)(slash - inc), inc);
                snprintf(ifile, sizeof ifile, "%s", slash + 1);
            } else {
                snprintf(idir, sizeof idir, "%.60s", dir);
                snprintf(ifile, sizeof ifile, "%s", inc);
            }
            char ipath[512];
            struct stat st;
            snprintf(ipath, sizeof ipath, "%s/%s/%s", src, idir, ifile);
            CHECK(stat(ipath, &st) == 0, "%s/%s includes \"%s\", which is not %s", dir, file,
                  inc, ipath);
            const int irank = layer_rank(idir);
            CHECK(irank >= 0, "%s/%s includes \"%s\" from an unknown layer", dir, file, inc);
            CHECK(irank <= rank, "%s/%s (layer %s) includes \"%s\" from the layer above, %s",
                  dir, file, dir, inc, idir);
            if (self && self->n_inc < MAX_INC)
                snprintf(self->inc[self->n_inc++], sizeof self->inc[0], "%.60s/%.60s", idir, ifile);
        }
        line = next;
    }
    free(text);
}

/* depth-first search; mark 1 = on the current path, 2 = done */
static int has_cycle(header *h, char *path, size_t size)
{
    if (h->mark == 1) {
        snprintf(path, size, "%s", h->name);
        return 1;
    }
    if (h->mark == 2) return 0;
    h->mark = 1;
    for (int i = 0; i < h->n_inc; i++) {
        header *t = header_get(h->inc[i]);
        if (t && has_cycle(t, path, size)) {
            size_t l = strlen(path);
            snprintf(path + l, size - l, " <- %s", h->name);
            return 1;
        }
    }
    h->mark = 2;
    return 0;
}

int main(void)
{
    const char *src = getenv("SPARQ_SRC") ? getenv("SPARQ_SRC") : "src";
    DIR *top = opendir(src);
    CHECK(top != NULL, "cannot open %s (run from the repository root)", src);
    if (!top) return test_summary("test_layers");
    int n_files = 0, n_dirs = 0;
    struct dirent *de;
    while ((de = readdir(top))) {
        if (de->d_name[0] == '.') continue;
        char sub[512];
        snprintf(sub, sizeof sub, "%s/%s", src, de->d_name);
        struct stat st;
        if (stat(sub, &st) || !S_ISDIR(st.st_mode)) {
            const size_t l = strlen(de->d_name);
            CHECK(l > 3 && !strcmp(de->d_name + l - 3, ".md"),
                  "%s is a source file outside a layer folder", sub);
            continue;
        }
        CHECK(layer_rank(de->d_name) >= 0, "src/%s is not a layer named in src/README.md",
              de->d_name);
        n_dirs++;
        DIR *d = opendir(sub);
        if (!d) continue;
        struct dirent *fe;
        while ((fe = readdir(d))) {
            const size_t l = strlen(fe->d_name);
            const int code = (l > 2 && (!strcmp(fe->d_name + l - 2, ".c") ||
                                        !strcmp(fe->d_name + l - 2, ".h"))) ||
                             (l > 3 && !strcmp(fe->d_name + l - 3, ".cc"));
            if (!code) continue;
            check_file(src, de->d_name, fe->d_name);
            n_files++;
        }
        closedir(d);
    }
    closedir(top);
    CHECK(n_dirs >= 8 && n_files >= 50, "only %d layer folders and %d files found", n_dirs,
          n_files);
    char path[2048] = "";
    int cycles = 0;
    for (int i = 0; i < n_hdrs; i++)
        if (hdrs[i].mark == 0 && has_cycle(&hdrs[i], path, sizeof path)) {
            CHECK(0, "include cycle: %s", path);
            cycles++;
            break;
        }
    CHECK(cycles == 0, "headers include each other in a circle");
    return test_summary("test_layers");
}
