/* webui.h - the chat page served at GET / (webui/index.html): one static
 * HTML file with its script and style inline, no other request than to
 * this server's API, so it works offline.
 *
 * The Makefile turns webui/index.html into the bytes below (od + sed into
 * $(BUILD)/gen/webui_html.c), so the page is edited as an ordinary file
 * and the binary carries it. The page holds the placeholder
 * SRV_WEBUI_NONCE_MARK wherever its inline <script> and <style> need the
 * response's nonce: the Content-Security-Policy sent with each copy
 * allows those elements, and nothing inline or from elsewhere besides. */
#ifndef SPARQ_SRV_WEBUI_H
#define SPARQ_SRV_WEBUI_H

#include <stddef.h>

extern const unsigned char srv_webui_html[];
extern const size_t srv_webui_html_len;

#define SRV_WEBUI_NONCE_MARK "__SPARQ_NONCE__"
enum { SRV_WEBUI_NONCE_LEN = 32 }; /* hex digits of 16 random bytes */

/* A copy of the page (malloc'ed, *len bytes, NUL-terminated) with every
 * nonce mark replaced by nonce (SRV_WEBUI_NONCE_LEN hex digits, which
 * this fills from the OS's random source); NULL when out of memory or
 * without randomness. */
char *srv_webui_page(char nonce[SRV_WEBUI_NONCE_LEN + 1], size_t *len);

/* The Content-Security-Policy for a copy with that nonce, into buf. */
void srv_webui_csp(const char *nonce, char *buf, size_t size);

#endif
