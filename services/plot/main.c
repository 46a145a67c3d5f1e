/* dflash-plot: the program behind `dflash plot` (services/plot/plot.h). A program of its own so that only it links
 * Cairo. */
#include "plot.h"

int main(int argc, char **argv) { return cmd_plot(argc, argv); }
