/* eval: `dflash eval`, the acceptance length tau of a DFlash drafter measured by speculative decoding with the
 * target at temperature 0, one prompt at a time (common/decode/spec_decode.h), against target-only greedy decoding
 * of the same prompts (wall-clock speedup); or with --walk the same accepted lengths without decoding, on text that
 * is the target's own greedy continuation. Prints a table, or JSON with --json. Exit: 0 done, 1 error, 2 usage. */
#ifndef DFLASH_EVAL_H
#define DFLASH_EVAL_H

/* argv[0] is "eval". */
int cmd_eval(int argc, char **argv);

#endif
