/* Private to data/: the Unicode class table of the GPT-2 pre-tokenizer and the small strict
 * JSON reader shared by the vocabulary loader and the JSONL corpus reader. */
#ifndef TR_DATA_PRIVATE_H
#define TR_DATA_PRIVATE_H

#include <stddef.h>

enum { TR_UC_OTHER = 0, TR_UC_LETTER = 1, TR_UC_NUMBER = 2, TR_UC_SPACE = 3 };

/* The class of a code point (generated table, data/unicode_class.c). */
int tr_unicode_class(unsigned cp);

/* Length of the valid UTF-8 sequence at s[0..n) (1-4), or 0 when it is not valid (a stray
 * continuation byte, an overlong form, a surrogate, beyond U+10FFFF or truncated). */
int tr_utf8_decode(const unsigned char *s, size_t n, unsigned *cp);

/* A cursor over JSON text. On error, err holds the message and at the byte offset. */
typedef struct {
    const char *s;
    size_t n, i;
    char err[160];
    size_t at;
} tr_json;

void tr_json_ws(tr_json *j);
/* Expect the byte c (after whitespace); 0 or -1 with an error. */
int tr_json_expect(tr_json *j, char c);
/* Read a string at the cursor into out (decoded UTF-8, cap bytes; *len gets its length);
 * -1 on a malformed string or one longer than cap. out may be NULL to only skip it. */
int tr_json_string(tr_json *j, char *out, size_t cap, size_t *len);
/* Read a non-negative integer that fits an int. */
int tr_json_int(tr_json *j, long *v);
/* Skip one value of any type (nesting bounded). */
int tr_json_skip(tr_json *j);

#endif
