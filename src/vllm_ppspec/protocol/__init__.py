"""The pure protocol: round matrices and their channel, the lane book, accepted
counts, the DP agreement, fault switches. No module here imports vLLM."""

# The version of what the plugin's PP ranks send each other after start-up:
# the round's shape agreement and the round message (rounds.py), the peer
# watch's set-up and messages (runner/health/peer_watch.py), and the order in which
# ranks send and receive them. Bump it with any change to any of them;
# ranks of different numbers refuse at start-up (runner/health/startup_check.py)
# instead of hanging at the first round. The start-up check itself (a gloo
# monitored_barrier, then an all_gather_object of a dict of strings) must stay
# as it is, so that any two versions can compare their numbers.
#   1: each round an all_reduce of every rank's side (no number was sent)
#   2: each round one message, the last rank's isend to each other rank's irecv
#   3: the peer watch gathers (host, port, token, executor) and a connecting
#      rank sends a hello (magic, its rank, its token), not its bare rank; a
#      rank that stops in order sends each peer one goodbye byte
#   4: the peer watch also gathers each rank's beat port, and every rank sends
#      each peer a UDP beat (magic, its rank, its token) every interval
PROTOCOL = 4
