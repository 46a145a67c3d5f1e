/* config: defaults, a full file, every error kind named by file:line and section.key, overrides, get, help, and a
 * dump that re-reads to the same values. */
#include <errno.h>

#include "config.h"
#include "tests/test.h"

struct svc {
    int steps;
    double lr;
    int bf16;
    char name[CONFIG_STRING_MAX];
    config_int_list taps;
    int port;
    char endpoint[CONFIG_STRING_MAX];
    int device;
};

static const char *const device_names[] = {"cpu", "cuda", "rocm", NULL};

static const config_field svc_table[] = {
    {"train", "steps", CONFIG_INT, offsetof(struct svc, steps), 1, 1e9, "1000", 0, "optimizer steps", NULL},
    {"train", "lr", CONFIG_DOUBLE, offsetof(struct svc, lr), 0, 1, "3e-4", 1, "peak learning rate", NULL},
    {"train", "bf16", CONFIG_BOOL, offsetof(struct svc, bf16), 0, 0, "true", 0, "bf16 compute", NULL},
    {"model", "name", CONFIG_STRING, offsetof(struct svc, name), 0, 0, "qwen3-8b", 0, "model name", NULL},
    {"model", "taps", CONFIG_INT_LIST, offsetof(struct svc, taps), 0, 127, "1, 9, 17", 0, "tapped layers", NULL},
    {"model", "device", CONFIG_ENUM, offsetof(struct svc, device), 0, 0, "cuda", 0, "compute device", device_names},
    {"ctl", "port", CONFIG_INT, offsetof(struct svc, port), 0, 0, NULL, 1, "unbounded", NULL},
    {"ctl", "endpoint", CONFIG_STRING, offsetof(struct svc, endpoint), 0, 0, NULL, 0, NULL, NULL},
    {0},
};

static void svc_defaults(struct svc *s)
{
    memset(s, 0x5a, sizeof *s);
    config_defaults(svc_table, s);
}

TEST(defaults)
{
    struct svc s;
    svc_defaults(&s);
    EXPECT(s.steps == 1000 && s.lr == 3e-4 && s.bf16 == 1);
    EXPECT(strcmp(s.name, "qwen3-8b") == 0);
    EXPECT(s.taps.n == 3 && s.taps.v[0] == 1 && s.taps.v[1] == 9 && s.taps.v[2] == 17);
    EXPECT(s.port == 0 && s.endpoint[0] == '\0');
    EXPECT(s.device == 1);
}

TEST(full_file)
{
    const char *text = "; a comment\n"
                       "# another\n"
                       "[train]\n"
                       "steps = 250000\n"
                       "  lr=1.5e-4   ; inline comment\n"
                       "bf16 = off\n"
                       "\n"
                       "[model]\n"
                       "name = \" spaced name \"\n"
                       "taps = [0, 5, 127]\n"
                       "[ctl]\n"
                       "port = -7\n"
                       "endpoint = ipc:///run/dflash/job/ctl\n"
                       "[train]\n"; /* a section may reopen */
    char *dir = test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/svc.ini", dir);
    test_write_file(path, text, strlen(text));
    struct svc s;
    svc_defaults(&s);
    errbuf err = {{0}};
    int ret = config_load_file(svc_table, &s, path, &err);
    if (ret) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(ret == 0);
    EXPECT(s.steps == 250000 && s.lr == 1.5e-4 && s.bf16 == 0);
    EXPECT(strcmp(s.name, " spaced name ") == 0);
    EXPECT(s.taps.n == 3 && s.taps.v[0] == 0 && s.taps.v[2] == 127);
    EXPECT(s.port == -7 && strcmp(s.endpoint, "ipc:///run/dflash/job/ctl") == 0);
    /* a partial file keeps the other values */
    svc_defaults(&s);
    EXPECT(config_load_string(svc_table, &s, "[train]\nsteps = 5\n", "part.ini", &err) == 0);
    EXPECT(s.steps == 5 && s.lr == 3e-4 && s.taps.n == 3);
    EXPECT(config_load_file(svc_table, &s, "/nonexistent/svc.ini", &err) == -ENOENT);
    EXPECT_CONTAINS(err.msg, "/nonexistent/svc.ini");
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    EXPECT(system(path) == 0);
}

/* Each bad file must fail with exactly this message, and leave the object untouched. */
TEST(file_errors)
{
    struct { const char *text, *want; } cases[] = {
        {"[train]\nsteps = 1\n[nope]\nx = 1\n", "bad.ini:4: nope.x: unknown section [nope]"},
        {"[train]\nstep = 1\n", "bad.ini:2: train.step: unknown key"},
        {"steps = 1\n", "bad.ini:1: steps: key outside any [section]"},
        {"[train]\nsteps = 12x\n", "bad.ini:2: train.steps: expected an integer, got \"12x\""},
        {"[train]\nsteps = 99999999999\n", "bad.ini:2: train.steps: expected an integer, got \"99999999999\""},
        {"[train]\nsteps = \n", "bad.ini:2: train.steps: expected an integer, got \"\""},
        {"[train]\nsteps = 0\n", "bad.ini:2: train.steps: value 0 out of range [1, 1000000000]"},
        {"[train]\nlr = fast\n", "bad.ini:2: train.lr: expected a number, got \"fast\""},
        {"[train]\nlr = nan\n", "bad.ini:2: train.lr: expected a finite number"},
        {"[train]\nlr = 2\n", "bad.ini:2: train.lr: value 2 out of range [0, 1]"},
        {"[train]\nbf16 = maybe\n", "bad.ini:2: train.bf16: expected true or false"},
        {"[model]\ntaps = 1, x, 3\n", "bad.ini:2: model.taps: element 1: expected an integer, got \"x\""},
        {"[model]\ntaps = 1,,3\n", "bad.ini:2: model.taps: element 1 is empty"},
        {"[model]\ntaps = 1, 2,\n", "bad.ini:2: model.taps: element 2 is empty"},
        {"[model]\ntaps = [1, 2\n", "bad.ini:2: model.taps: missing closing ]"},
        {"[model]\ntaps = 1, 2]\n", "bad.ini:2: model.taps: missing opening ["},
        {"[model]\ntaps = 1, 200\n", "bad.ini:2: model.taps: element 1: value 200 out of range [0, 127]"},
        {"[model]\ndevice = tpu\n", "bad.ini:2: model.device: expected one of cpu, cuda, rocm; got \"tpu\""},
        {"[model]\ndevice = CUDA\n", "bad.ini:2: model.device: expected one of cpu, cuda, rocm; got \"CUDA\""},
        {"[model]\ndevice = 1\n", "bad.ini:2: model.device: expected one of cpu, cuda, rocm; got \"1\""},
        {"[train]\nsteps = 1\nlr = 0.1\nsteps = 2\n", "bad.ini:4: train.steps: given twice (first at line 2)"},
        {"[train]\nsteps = 1\n[train]\nsteps = 2\n", "bad.ini:4: train.steps: given twice (first at line 2)"},
        {"[train\nsteps = 1\n", "bad.ini:1: syntax error"},
        {"[train]\nsteps\n", "bad.ini:2: syntax error"},
        {"[train]\njunk\nsteps = 0\n", "bad.ini:2: syntax error"},   /* the first error wins */
        {"[train]\nsteps = 0\njunk\n", "bad.ini:2: train.steps: value 0 out of range"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct svc s, before;
        svc_defaults(&s);
        before = s;
        errbuf err = {{0}};
        EXPECT(config_load_string(svc_table, &s, cases[i].text, "bad.ini", &err) == -EINVAL);
        EXPECT_CONTAINS(err.msg, cases[i].want);
        EXPECT(memcmp(&s, &before, sizeof s) == 0);
    }
    /* too many list elements, too long a string, too long a line */
    char text[2048];
    int off = snprintf(text, sizeof text, "[model]\ntaps = 0");
    for (int i = 1; i <= CONFIG_LIST_MAX; i++) off += snprintf(text + off, sizeof text - (size_t)off, ",%d", i % 10);
    snprintf(text + off, sizeof text - (size_t)off, "\n");
    struct svc s;
    svc_defaults(&s);
    errbuf err = {{0}};
    EXPECT(config_load_string(svc_table, &s, text, "bad.ini", &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "bad.ini:2: ");
    EXPECT_CONTAINS(err.msg, "model.taps: more than 64 elements");
    char longv[400];
    memset(longv, 'a', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    EXPECT(config_set(svc_table, &s, "model.name", longv, "--set", &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "--set: model.name: value longer than 255 characters");
    snprintf(text, sizeof text, "[model]\nname = %s\n", longv);
    EXPECT(config_load_string(svc_table, &s, text, "bad.ini", &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "bad.ini:2: line longer than");
}

TEST(overrides)
{
    struct svc s;
    svc_defaults(&s);
    errbuf err = {{0}};
    EXPECT(config_set(svc_table, &s, "train.lr", "1e-4", "--set", &err) == 0);
    EXPECT(s.lr == 1e-4);
    EXPECT(config_set_arg(svc_table, &s, "model.taps=[]", "--set", &err) == 0);
    EXPECT(s.taps.n == 0);
    EXPECT(config_set_arg(svc_table, &s, "train.bf16=Yes", "--set", &err) == 0);
    EXPECT(s.bf16 == 1);
    EXPECT(config_set_arg(svc_table, &s, "model.name=", "--set", &err) == 0);
    EXPECT(config_set_arg(svc_table, &s, "model.device=rocm", "--set", &err) == 0);
    EXPECT(s.device == 2);
    EXPECT(config_set_arg(svc_table, &s, "model.device=", "--set", &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "--set: model.device: expected one of cpu, cuda, rocm; got \"\"");
    EXPECT(s.device == 2);
    EXPECT(s.name[0] == '\0');
    EXPECT(config_set(svc_table, &s, "train.nope", "1", "--set", &err) == -ENOENT);
    EXPECT_CONTAINS(err.msg, "--set: train.nope: unknown key");
    EXPECT(config_set(svc_table, &s, "train.lr", "-1", "dflashctl", &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "dflashctl: train.lr: value -1 out of range [0, 1]");
    EXPECT(s.lr == 1e-4);
    EXPECT(config_set_arg(svc_table, &s, "train.lr", "--set", &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "--set: \"train.lr\": expected section.key=value");
    const config_field *f = config_find(svc_table, "train.lr");
    EXPECT(f && f->runtime_changeable == 1);
    EXPECT(config_find(svc_table, "train") == NULL && config_find(svc_table, "trainlr") == NULL);
}

TEST(get_and_dump_round_trip)
{
    struct svc s;
    svc_defaults(&s);
    errbuf err = {{0}};
    REQUIRE(config_load_string(svc_table, &s,
                               "[train]\nlr = 0.1\nsteps = 7\n[model]\nname = \"quoted\"\ntaps = 3,1 , 2\n"
                               "[ctl]\nendpoint =   tcp://h:1  \n", "x.ini", &err) == 0);
    char buf[64];
    EXPECT(config_get(svc_table, &s, "train.lr", buf, sizeof buf) == 0 && strcmp(buf, "0.1") == 0);
    EXPECT(config_get(svc_table, &s, "train.bf16", buf, sizeof buf) == 0 && strcmp(buf, "true") == 0);
    EXPECT(config_get(svc_table, &s, "model.taps", buf, sizeof buf) == 0 && strcmp(buf, "3, 1, 2") == 0);
    EXPECT(config_get(svc_table, &s, "model.name", buf, sizeof buf) == 0 && strcmp(buf, "quoted") == 0);
    EXPECT(config_get(svc_table, &s, "ctl.endpoint", buf, sizeof buf) == 0 && strcmp(buf, "tcp://h:1") == 0);
    EXPECT(config_get(svc_table, &s, "model.device", buf, sizeof buf) == 0 && strcmp(buf, "cuda") == 0);
    EXPECT(config_get(svc_table, &s, "x.y", buf, sizeof buf) == -ENOENT);
    EXPECT(config_get(svc_table, &s, "model.taps", buf, 4) == -ERANGE);

    s.lr = 1.0 / 3.0;
    s.device = 0;
    EXPECT(config_set(svc_table, &s, "ctl.endpoint", "\" padded \"", "--set", &err) == 0);
    char *dump = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&dump, &len);
    config_dump(svc_table, &s, m);
    fclose(m);
    EXPECT_CONTAINS(dump, "[train]\nsteps = 7\nlr = 0.3333333333333333\nbf16 = true\n");
    EXPECT_CONTAINS(dump, "[model]\nname = quoted\ntaps = 3, 1, 2\ndevice = cpu\n");
    EXPECT_CONTAINS(dump, "[ctl]\nport = 0\nendpoint = \" padded \"\n");
    struct svc back;
    svc_defaults(&back);
    int ret = config_load_string(svc_table, &back, dump, "dump.ini", &err);
    if (ret) fprintf(stderr, "  %s\n%s", err.msg, dump);
    REQUIRE(ret == 0);
    EXPECT(back.steps == s.steps && back.lr == s.lr && back.bf16 == s.bf16 && back.port == s.port);
    EXPECT(back.device == 0);
    EXPECT(strcmp(back.name, s.name) == 0 && strcmp(back.endpoint, " padded ") == 0);
    EXPECT(back.taps.n == s.taps.n && memcmp(back.taps.v, s.taps.v, sizeof(int) * (size_t)s.taps.n) == 0);
    free(dump);

    /* the defaults, with an empty string, re-read too */
    svc_defaults(&s);
    m = open_memstream(&dump, &len);
    config_dump(svc_table, &s, m);
    fclose(m);
    EXPECT_CONTAINS(dump, "endpoint = \n");
    memset(&back, 0, sizeof back);
    strcpy(back.endpoint, "x");
    EXPECT(config_load_string(svc_table, &back, dump, "dump.ini", &err) == 0);
    EXPECT(back.endpoint[0] == '\0' && back.steps == 1000 && back.taps.n == 3 && back.lr == 3e-4);
    free(dump);

    /* whole numbers as such (issue 14: `config` printed watchdog_sec = 1e+01) */
    s.lr = 10;
    m = open_memstream(&dump, &len);
    config_dump(svc_table, &s, m);
    fclose(m);
    EXPECT_CONTAINS(dump, "lr = 10\n");
    free(dump);
}

TEST(help)
{
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    config_help(svc_table, m);
    fclose(m);
    EXPECT_CONTAINS(text, "train.lr");
    EXPECT_CONTAINS(text, "double");
    EXPECT_CONTAINS(text, "[0, 1]");
    EXPECT_CONTAINS(text, "default: 3e-4  (runtime)");
    EXPECT_CONTAINS(text, "peak learning rate");
    EXPECT_CONTAINS(text, "model.taps");
    EXPECT_CONTAINS(text, "int list  [0, 127]  default: 1, 9, 17");
    EXPECT_CONTAINS(text, "model.device                     enum      {cpu, cuda, rocm}  default: cuda");
    free(text);
}

TEST_MAIN
