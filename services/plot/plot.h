/* plot: `dflash plot RUN_DIR [-o FILE.png|.svg]`, a figure of a job's training over steps drawn with Cairo: the
 * loss, the per-slot accuracy, and the acceptance length tau (simulated, from RUN_DIR/metrics.jsonl; decoded by the
 * evaluation worker, from RUN_DIR/eval.jsonl when there is one). Reads a running job's files as well (a last line
 * still being written is left out). Errors name the file and line. Exit: 0 written, 1 error, 2 usage. */
#ifndef DFLASH_PLOT_H
#define DFLASH_PLOT_H

/* argv[0] is "plot". */
int cmd_plot(int argc, char **argv);

#endif
