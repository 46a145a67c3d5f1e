/* tfevents: CRC32C against its check value, TFRecord framing written and read back, a corrupt or torn record
 * refused naming its offset; the step event carries the metrics.jsonl scalars. */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>

#include "tensorboard.pb-c.h"
#include "tfevents.h"
#include "tests/test.h"

TEST(crc32c_check_value)
{
    EXPECT(tfevents_crc32c("123456789", 9) == 0xE3069283u); /* the CRC-32C check value (RFC 3720 B.4) */
    EXPECT(tfevents_crc32c("", 0) == 0);
    uint8_t zeros[32] = {0};
    EXPECT(tfevents_crc32c(zeros, 32) == 0x8A9136AAu); /* RFC 3720 B.4: 32 bytes of zeros */
    EXPECT(tfevents_crc_mask(0) == 0xa282ead8u);
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    uint8_t *b = malloc(1 << 20);
    *n = fread(b, 1, 1 << 20, f);
    fclose(f);
    return b;
}

static char *write_file(void)
{
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/test_tfevents-%d", (int)getpid());
    tfevents *t;
    errbuf err = {{0}};
    REQUIRE(tfevents_open(&t, dir, &err) == 0);
    step_summary s = {0};
    s.loss = 2.5;
    s.acceptance = 1.25;
    s.grad_norm = 0.0; /* a zero is written too (simple_value in a oneof) */
    s.lr = 3e-4;
    s.tokens = 1234;
    s.per_slot_total[1] = 4, s.per_slot_correct[1] = 3;
    s.per_slot_total[2] = 4, s.per_slot_correct[2] = 1;
    REQUIRE(tfevents_write_step(t, 7, &s, 4, &err) == 0);
    static char path[4096];
    snprintf(path, sizeof path, "%s", tfevents_path(t));
    tfevents_destroy(&t);
    EXPECT(t == NULL);
    EXPECT_CONTAINS(path, "/events.out.tfevents.");
    return path;
}

TEST(framing_round_trip)
{
    const char *path = write_file();
    size_t n, pos = 0, len;
    uint8_t *b = slurp(path, &n);
    const uint8_t *d;
    errbuf err = {{0}};
    REQUIRE(tfevents_record_next(b, n, &pos, &d, &len, &err) == 0);
    Tensorboard__Event *ev = tensorboard__event__unpack(NULL, len, d);
    REQUIRE(ev && ev->what_case == TENSORBOARD__EVENT__WHAT_FILE_VERSION);
    EXPECT(!strcmp(ev->file_version, "brain.Event:2"));
    EXPECT(ev->wall_time > 1.6e9);
    tensorboard__event__free_unpacked(ev, NULL);
    REQUIRE(tfevents_record_next(b, n, &pos, &d, &len, &err) == 0);
    ev = tensorboard__event__unpack(NULL, len, d);
    REQUIRE(ev && ev->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY && ev->step == 7);
    const char *tags[] = {"loss", "slot_accuracy/1", "slot_accuracy/2", "slot_accuracy/3", "acceptance", "grad_norm",
                          "lr", "tokens"};
    const double want[] = {2.5, 0.75, 0.25, 0, 1.25, 0, 3e-4, 1234};
    REQUIRE(ev->summary->n_value == 8);
    for (int i = 0; i < 8; i++) {
        EXPECT(!strcmp(ev->summary->value[i]->tag, tags[i]));
        EXPECT(ev->summary->value[i]->value_case == TENSORBOARD__SUMMARY_VALUE__VALUE_SIMPLE_VALUE);
        EXPECT_NEAR(ev->summary->value[i]->simple_value, want[i], 1e-7 * (1 + want[i]));
    }
    tensorboard__event__free_unpacked(ev, NULL);
    EXPECT(tfevents_record_next(b, n, &pos, &d, &len, &err) == 1);
    EXPECT(pos == n);
    free(b);
}

TEST(corrupt_and_torn_records_refused)
{
    const char *path = write_file();
    size_t n, pos = 0, len;
    uint8_t *b = slurp(path, &n);
    const uint8_t *d;
    errbuf err = {{0}};
    REQUIRE(tfevents_record_next(b, n, &pos, &d, &len, &err) == 0);
    size_t second = pos;
    b[n - 6] ^= 0x40; /* a byte of the second record's data */
    EXPECT(tfevents_record_next(b, n, &pos, &d, &len, &err) == -EBADMSG);
    EXPECT_CONTAINS(err.msg, "data CRC");
    b[n - 6] ^= 0x40;
    pos = second;
    b[second + 1] ^= 1; /* its length */
    EXPECT(tfevents_record_next(b, n, &pos, &d, &len, &err) == -EBADMSG);
    EXPECT_CONTAINS(err.msg, "length CRC");
    b[second + 1] ^= 1;
    pos = second;
    EXPECT(tfevents_record_next(b, n - 3, &pos, &d, &len, &err) == -EBADMSG);
    EXPECT_CONTAINS(err.msg, "torn");
    char at[64];
    snprintf(at, sizeof at, "record at byte %zu", second);
    EXPECT_CONTAINS(err.msg, at);
    free(b);
}

TEST(open_refuses_unusable_dir)
{
    tfevents *t = (tfevents *)1;
    errbuf err = {{0}};
    EXPECT(tfevents_open(&t, "/nonexistent-dir/x/tensorboard", &err) < 0);
    EXPECT(t == NULL);
    EXPECT_CONTAINS(err.msg, "/nonexistent-dir/x/tensorboard");
}

TEST_MAIN
