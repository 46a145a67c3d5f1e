/* test_eta: the progress line's time left (step_format_eta) stays short and readable at any length: minutes and
 * seconds under an hour, then hours and minutes, then days and hours (issue 14: a 7-hour ETA read "441:19"). */
#include "step.h"
#include "tests/test.h"

static const char *eta(double sec)
{
    static char buf[32];
    step_format_eta(sec, buf, sizeof buf);
    return buf;
}

TEST(eta_under_an_hour_is_minutes_and_seconds)
{
    EXPECT(!strcmp(eta(0), "0:00"));
    EXPECT(!strcmp(eta(245), "4:05"));
    EXPECT(!strcmp(eta(3599), "59:59"));
}

TEST(eta_of_hours_and_days)
{
    EXPECT(!strcmp(eta(26479), "7h21m")); /* was "441:19" */
    EXPECT(!strcmp(eta(3600), "1h00m"));
    EXPECT(!strcmp(eta(3 * 86400 + 4 * 3600 + 59), "3d04h"));
}

TEST(eta_unknown_or_absurd_is_zero_not_garbage)
{
    EXPECT(!strcmp(eta(-5), "0:00"));
    EXPECT(!strcmp(eta(NAN), "0:00"));
    EXPECT(strlen(eta(1e12)) <= 8);
}

TEST_MAIN
