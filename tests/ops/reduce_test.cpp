#include "test_util.h"
TEST(Sum, Smoke) { EXPECT_EQ(kiln::sum(kiln::ones({3,4})).item<float>(), 12.f); }
