/* YAML texts checked before libyaml builds a document of them: libyaml's loader takes minutes
 * over a text nested 100,000 deep (200 KB), its event parser stops at once. Every YAML reader
 * of the trainer (cluster files, checkpoint manifests) calls this first. */
#ifndef TR_YAML_H
#define TR_YAML_H

#include <stddef.h>

/* The 1-based line of the first collection nested deeper than max_depth, counted on libyaml's
 * events; 0 when there is none, also when the text is not YAML (the loader then says why, as
 * it would), -1 when out of memory. */
int tr_yaml_too_deep(const char *text, size_t len, int max_depth);

#endif
