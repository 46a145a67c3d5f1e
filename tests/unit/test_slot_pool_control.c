/* slot_pool's GPU-pool path without a GPU: the keeper creates only the control segment; the deposited allocation's
 * fd (a memfd stands in for a VMM fd here) is adopted once, its GPU UUID lands in the header and every descriptor,
 * a worker attaching the control segment sees both, and the slot protocol works on a control-only handle. */
#include "shm.h"
#include "slot_pool.h"
#include "tests/test.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

TEST(control_only_pool_takes_a_device_deposit_once)
{
    char name[128];
    snprintf(name, sizeof name, "/dflash-test-%d-gpupool", (int)getpid());
    errbuf err = {{0}};
    struct slot_pool *k = NULL, *w = NULL;
    REQUIRE(slot_pool_create_control(name, 3, 5000, &k, &err) == 0);
    EXPECT(slot_pool_data_fd(k) == -1);
    EXPECT(slot_pool_slot_bytes(k) == 8192);
    uint8_t uuid[16], got[16];
    uint64_t bytes = 0;
    for (int i = 0; i < 16; i++) uuid[i] = (uint8_t)(0xa0 + i);
    EXPECT(slot_pool_device(k, got, &bytes) == -ENOENT);
    int fd = memfd_create("fake-vmm", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    EXPECT(slot_pool_set_device_data(k, fd, uuid, 3 * 8192 - 1, &err) == -EINVAL); /* too small: refused */
    EXPECT(slot_pool_data_fd(k) == -1);
    REQUIRE(slot_pool_set_device_data(k, fd, uuid, 2 << 20, &err) == 0);
    EXPECT(slot_pool_data_fd(k) == fd);
    int fd2 = memfd_create("fake-vmm-2", MFD_CLOEXEC);
    EXPECT(slot_pool_set_device_data(k, fd2, uuid, 2 << 20, &err) == -EEXIST); /* one deposit per pool */
    close(fd2);

    REQUIRE(slot_pool_attach_control(name, &w, &err) == 0);
    EXPECT(slot_pool_data_fd(w) == -1);
    EXPECT(slot_pool_device(w, got, &bytes) == 0);
    EXPECT(bytes == (2u << 20));
    EXPECT(memcmp(got, uuid, 16) == 0);
    for (int i = 0; i < 3; i++) EXPECT(memcmp(slot_pool_desc(w, i)->device_uuid, uuid, 16) == 0);
    /* the protocol on control-only handles: claim, publish, lease, release; reclaim of a dead consumer */
    int s = slot_pool_claim(w, 1, 5, 0);
    REQUIRE(s >= 0);
    slot_pool_desc(w, s)->batch_id = 42;
    slot_pool_desc(w, s)->bytes_used = 8192;
    EXPECT(slot_pool_publish(w, s, 1, 5) == 0);
    EXPECT(slot_pool_lease_batch(k, 42, 100, 6, 0) == s);
    int freed = 0, returned = 0;
    EXPECT(slot_pool_reclaim(k, 6, &freed, &returned) == 1 && returned == 1);
    EXPECT(slot_pool_lease_batch(w, 42, 100, 7, 0) == s);
    EXPECT(slot_pool_release(w, s, 100, 7) == 0);
    slot_pool_destroy(&w);
    slot_pool_destroy(&k); /* closes the adopted fd */
    EXPECT(fcntl(fd, F_GETFD) == -1);
    slot_pool_unlink(name, NULL);
}

/* On a control-only (GPU) handle the data cannot be read here: the reader's check covers the descriptor alone. */
TEST(control_only_reader_check_covers_the_descriptor)
{
    char name[128];
    snprintf(name, sizeof name, "/dflash-test-%d-gpucheck", (int)getpid());
    errbuf err = {{0}};
    struct slot_pool *k = NULL;
    REQUIRE(slot_pool_create_control(name, 2, 8192, &k, &err) == 0);
    const struct slot_pool_shape shape = { .max_tokens = 16, .max_seqs = 4, .cu_seqlens = 1 << 20 };
    int s = slot_pool_claim(k, 1, 5, 0);
    REQUIRE(s >= 0);
    struct slot_pool_desc *d = slot_pool_desc(k, s);
    d->batch_id = 8, d->ntok = 16, d->nseq = 4, d->bytes_used = 8192;
    EXPECT(slot_pool_slot_check(k, s, &shape, &err) == 0); /* cu_seqlens is not looked at */
    d->nseq = 9;
    EXPECT(slot_pool_slot_check(k, s, &shape, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, name);
    EXPECT_CONTAINS(err.msg, "nseq 9");
    EXPECT(slot_pool_abandon(k, s, 1, 5) == 0);
    slot_pool_destroy(&k);
    slot_pool_unlink(name, NULL);
}

TEST_MAIN
