/* test_textbuf.c - growable strings and whole-file reads. */
#include "test.h"
#include "util/textbuf.h"
#include <sys/stat.h>
#include <unistd.h>

int main(void)
{
    text_buf t = { 0 };
    for (int i = 0; i < 1000; i++) CHECK(text_append(&t, "abc", 3) == 0, "append %d", i);
    CHECK(t.len == 3000 && strlen(t.data) == 3000 && memcmp(t.data + 2997, "abc", 3) == 0, "contents");
    CHECK(text_append(&t, "\0x", 2) == 0 && t.len == 3002 && t.data[3000] == 0 && t.data[3001] == 'x',
          "embedded NUL kept");
    char path[] = "/tmp/sparq_textbuf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, t.data, t.len) == (ssize_t)t.len, "write temp file");
    close(fd);
    size_t n = 0;
    char *back = text_read_file(path, &n);
    CHECK(back && n == t.len && memcmp(back, t.data, n) == 0 && back[n] == 0, "read back %zu bytes", n);
    free(back);
    unlink(path);
    CHECK(text_read_file("/nonexistent/file", &n) == NULL, "missing file");
    char empty[] = "/tmp/sparq_textbuf_empty_XXXXXX";
    fd = mkstemp(empty);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) close(fd);
    back = text_read_file(empty, &n);
    CHECK(back && n == 0 && back[0] == 0, "empty file");
    free(back);
    unlink(empty);
    /* a device is not a file: /dev/zero would never end */
    CHECK(text_read_file("/dev/null", &n) == NULL, "character device refused");
    /* a FIFO would block until a writer comes: refused at once */
    char dir[] = "/tmp/sparq_textbuf_fifo_XXXXXX", fifo[64];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(fifo, sizeof fifo, "%s/f", dir);
    CHECK(mkfifo(fifo, 0600) == 0 && text_read_file(fifo, &n) == NULL, "FIFO refused");
    unlink(fifo);
    rmdir(dir);
    free(t.data);
    return test_summary("test_textbuf");
}
