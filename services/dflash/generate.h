/* generate: `dflash generate`, the target's own answers to a set of prompts (greedy by default; --temperature samples
 * on the CPU, each draw a pure function of (seed, prompt line, position); stop at EOS or --max-new-tokens), written as the JSONL dflash-prepare reads (prompt tokens loss_mask 0, generated tokens 1), one
 * line per prompt in prompt-file order, keyed by the prompt's line number so that a rerun skips what is done.
 * Prompts are decoded on --threads worker threads, each with its own KV cache over one shared CPU target
 * (common/target/target_decode.h), or with --backend cuda (dflash-cuda) on the GPU, --batch sequences at once
 * (generate_cuda.c, common/target/target_decode_cuda.h). Errors name the file and line; exit 0 done, 1 error, 2 usage error. */
#ifndef DFLASH_GENERATE_H
#define DFLASH_GENERATE_H

/* argv[0] is "generate". */
int generate_main(int argc, char **argv);

#endif
