/* Private to data/: the Unicode class table of the GPT-2 pre-tokenizer and UTF-8 decoding
 * (the JSON reader is data/json.h). */
#ifndef TR_DATA_PRIVATE_H
#define TR_DATA_PRIVATE_H

#include <stddef.h>

enum { TR_UC_OTHER = 0, TR_UC_LETTER = 1, TR_UC_NUMBER = 2, TR_UC_SPACE = 3 };

/* The class of a code point (generated table, data/unicode_class.c). */
int tr_unicode_class(unsigned cp);

/* Length of the valid UTF-8 sequence at s[0..n) (1-4), or 0 when it is not valid (a stray
 * continuation byte, an overlong form, a surrogate, beyond U+10FFFF or truncated). */
int tr_utf8_decode(const unsigned char *s, size_t n, unsigned *cp);

#endif
