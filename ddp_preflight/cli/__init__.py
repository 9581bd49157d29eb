"""The commands: parse the arguments, call the libraries (preflight, launch, hangwatch, lab),
print what they return. Nothing else prints. `ddp-preflight` is ddp_preflight.main, `hangwatch`
is hangwatch.main; `python -m ddp_preflight` and `python -m ddp_preflight.hangwatch` reach the same."""
