"""The drafter under PP: vLLM builds it on the last rank only, as if PP were 1.
``scope.py`` hides it on the other ranks and shows it a single-stage PP group on
the last; ``embedding_share.py`` replays vLLM's decision to share the target's
token embedding with it and ``embedding_handover.py`` moves that embedding from
the first stage, once, after load; ``eagle3.py`` carries EAGLE-3's auxiliary
hidden states across the stages; ``dp_hook.py`` makes each drafter run agree
with the other DP ranks'."""
