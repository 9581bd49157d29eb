"""What each command's --help ends with: examples to copy, then what its exit codes mean
(tests/unit/test_newcomer_help.py puts every example through its command's parser)."""

PREFLIGHT = """examples:
  ddp-preflight                               # this machine alone
  ddp-preflight master worker1 --data-dir /data/shards -- train.py --steps 20
  ddp-preflight master worker1 --nproc-per-node 2 --launch --tui -- train.py
  ddp-preflight --hostfile hostfile --json > report.json
  ddp-preflight --list                        # the checks, one line each
  ddp-preflight explain ddp-preflight-runs/   # why a run failed, from its logs
  ddp-preflight lab up --fault firewall@worker1   # a LAN here to try it on

environment: DDP_PREFLIGHT_SSH_CONFIG the ssh config when no --ssh-config is given; NO_COLOR plain text, \
as --no-color; DDP_PREFLIGHT_DEBUG=1 shows an internal error's traceback

exit codes: 0 no failure, 1 a check failed (or warned, with --strict), 2 usage or internal error, 130 \
interrupted (Ctrl-C); with --launch: 0 every rank exited 0, 1 a rank failed, the run was stopped, or preflight \
refused"""

EXPLAIN = """examples:
  ddp-preflight explain ddp-preflight-runs/20261125-062250/  # a launch's logs
  ddp-preflight explain slurm-4242.out torchelastic_error.json
  ddp-preflight explain - < train.log        # a log, or what you paste
  ddp-preflight explain hangwatch-incidents/ --json

exit codes: 0 no failure found, 1 a failure explained (or found and not explained), 2 usage error or \
unreadable input, 130 interrupted (Ctrl-C)"""

LAB = """examples:
  ddp-preflight lab up --nodes 3 --fault vpn-ipv6@worker1
  ddp-preflight lab status
  ddp-preflight lab exec worker1 -- ip -br addr
  ddp-preflight lab fault add firewall@worker1
  ddp-preflight lab fault clear
  ddp-preflight lab down

environment: DDP_PREFLIGHT_LAB the lab's name when no --name is given (default lab)

exit codes: 0 done, 1 'down' could not remove everything, 2 usage error or the lab refused"""

HANGWATCH = """examples:
  hangwatch attach                           # the ranks on this machine
  hangwatch attach master worker1 --tui      # over ssh, on the dashboard
  hangwatch attach master --pid 4242 --exit-on-hang --json
  hangwatch attach --slurm-job 1234

environment: DDP_PREFLIGHT_SSH_CONFIG the ssh config when no --ssh-config is given; NO_COLOR a dashboard \
in greys; DDP_PREFLIGHT_DEBUG=1 shows an internal error's traceback

exit codes: 0 the run finished, or no hang was named before Ctrl-C or --for stopped the watch; 1 a hang was \
named, or a rank of the run did not exit 0; 2 usage error, no node could be watched, no rank found, or \
hangwatch's own error"""
