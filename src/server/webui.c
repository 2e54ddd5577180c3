/* webui.c - a copy of the chat page per request, each with its own nonce
 * (webui.h). A fixed page with 'unsafe-inline' would let any markup that
 * slipped into it run; with a fresh nonce only the page's own script and
 * style run, and a reply the page ever rendered as HTML could not. */
#include "server/webui.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

char *srv_webui_page(char nonce[SRV_WEBUI_NONCE_LEN + 1], size_t *len)
{
    unsigned char rb[SRV_WEBUI_NONCE_LEN / 2];
    /* a guessable nonce would be no nonce: no page without the OS's randomness */
    if (getrandom(rb, sizeof rb, 0) != (ssize_t)sizeof rb) return NULL;
    for (size_t i = 0; i < sizeof rb; i++) snprintf(nonce + 2 * i, 3, "%02x", rb[i]);
    const char *mark = SRV_WEBUI_NONCE_MARK, *src = (const char *)srv_webui_html;
    const size_t ml = strlen(mark), n = srv_webui_html_len;
    size_t marks = 0;
    for (const char *p = src; (p = memmem(p, n - (size_t)(p - src), mark, ml)) != NULL; p += ml) marks++;
    char *out = malloc(n - marks * ml + marks * SRV_WEBUI_NONCE_LEN + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (i + ml <= n && !memcmp(src + i, mark, ml)) {
            memcpy(out + o, nonce, SRV_WEBUI_NONCE_LEN);
            o += SRV_WEBUI_NONCE_LEN;
            i += ml;
        } else {
            out[o++] = src[i++];
        }
    }
    out[o] = 0;
    *len = o;
    return out;
}

void srv_webui_csp(const char *nonce, char *buf, size_t size)
{
    /* connect-src 'self': the page talks to this server alone, so a
     * conversation cannot be sent anywhere else from it */
    snprintf(buf, size,
             "default-src 'none'; script-src 'nonce-%s'; style-src 'nonce-%s'; connect-src 'self'; img-src data:; "
             "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
             nonce, nonce);
}
