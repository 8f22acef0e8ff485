# Sourced by scripts/fuzz.sh and scripts/fuzz_campaign.sh: the libFuzzer flags every run of a
# target uses. A 10 s per-input timeout (a hang or a spin fails), a 2 GiB RSS limit (libFuzzer's
# malloc limit is the same: one allocation above 2 GiB fails too), inputs up to 1 MB.
FUZZ_FLAGS=(-timeout=10 -rss_limit_mb=2048 -max_len=1048576)
