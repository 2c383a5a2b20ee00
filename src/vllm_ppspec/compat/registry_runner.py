"""The registry's ``runner`` group: changes made inside the plugin's runner, on one
object (a drafter instance) or for the length of one call. No vLLM import."""

from __future__ import annotations

from vllm_ppspec.compat.patch import Patch

RUNNER_PATCHES: tuple[Patch, ...] = (
    Patch(
        module="vllm_ppspec.runner.drafter.suffix_requests",
        when="runner",
        targets=("vllm.v1.spec_decode.suffix_decoding:SuffixDecodingProposer.propose",),
        why=(
            "the suffix proposer ends, in its cache, every request missing from the step's "
            "batch; the filled pipeline leaves each request out of all but one of every PP "
            "steps, so its response tree would be dropped and rebuilt from the prompt"
        ),
        how=(
            "the runner's propose_draft_token_ids runs vLLM's inside SuffixRequests.proposing, "
            "which sets the cache's stop_request on its instance to a no-op for that call; "
            "_update_states ends the requests the scheduler reports finished"
        ),
        upstream=(
            "none found; vllm/v1/spec_decode/suffix_decoding.py:SuffixDecodingProposer.propose"
        ),
        remove_when="vLLM's suffix proposer ends only finished requests",
        install=None,
        attributes=("SuffixDecodingCache.stop_request",),
    ),
    Patch(
        module="vllm_ppspec.runner.drafter.scope",
        when="runner",
        targets=(
            "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._get_model",
            "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._create_draft_vllm_config",
            "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.propose",
            "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.dummy_run",
        ),
        why=(
            "the drafter is a whole model on the last PP rank, but model code asks the "
            "global PP group which layers to build and whether to expect intermediate tensors"
        ),
        how=(
            "isolate_drafter(drafter), from the runner's load_model, wraps these on the last "
            "rank's drafter instance (the class is untouched): while they run, the PP group "
            "reads as one stage and the draft config has pipeline_parallel_size 1"
        ),
        upstream="vLLM #52071 (PP + spec on the V1 runner); none found for the drafter's scope",
        remove_when="vLLM builds and runs the drafter as one stage under PP",
        install=None,
        attributes=("SpecDecodeBaseProposer._ppspec_isolated",),
    ),
    Patch(
        module="vllm_ppspec.runner.drafter.scope",
        when="runner",
        targets=(
            "vllm.distributed.parallel_state:_PP",
            "vllm.envs:disable_envs_cache",
        ),
        why=(
            "make_layers and EAGLE's get_num_layers read the PP group and "
            "VLLM_PP_LAYER_PARTITION (the target's split) from module globals"
        ),
        how=(
            "single_stage_pp puts a one-stage view in parallel_state._PP for the length of "
            "a drafter call; target_partition_hidden turns vLLM's envs cache off and hides "
            "VLLM_PP_LAYER_PARTITION while the drafter is built; both put them back after"
        ),
        upstream="none found",
        remove_when="vLLM builds and runs the drafter as one stage under PP",
        install=None,
    ),
    Patch(
        module="vllm_ppspec.runner.drafter.dp_hook",
        when="runner",
        targets=(
            "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.propose",
            "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.dummy_run",
            "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._determine_batch_execution_and_padding",
        ),
        why=(
            "at DP > 1 (MoE targets) every drafter forward's collectives must be matched on "
            "the other DP ranks; vLLM relies on dummy_run issuing the same sequence as propose"
        ),
        how=(
            "dp_hook.install(drafter, group, dp_rank), from the runner's load_model, wraps "
            "them on the drafter instance: each drafter run agrees with the other DP ranks' "
            "first (protocol/dp_agreement.py), or every rank raises"
        ),
        upstream="none found",
        remove_when="vLLM agrees drafter runs across DP itself",
        install=None,
        attributes=("SpecDecodeBaseProposer._ppspec_dp_hook",),
    ),
    Patch(
        module="vllm_ppspec.runner.drafter.embedding_handover",
        when="runner",
        targets=(),
        why=(
            "an EAGLE or MTP head shares the target's token embedding, which under PP "
            "only the first rank holds; a head without an embedding weight (0.33's "
            "share mode REPLACE) gets the target's module installed by vLLM"
        ),
        how=(
            "give_drafter_the_target_embedding(runner, pp, is_last), from the runner's "
            "load_model: the first rank's weight over gloo, copied into the drafter's "
            "embedding, or (REPLACE) set as drafter.model.model.embed_tokens"
        ),
        upstream=(
            "none found; vllm/v1/spec_decode/llm_base_proposer.py:"
            "SpecDecodeBaseProposer._maybe_share_embeddings"
        ),
        remove_when="vLLM shares the target's embedding with the drafter across PP ranks",
        install=None,
        attributes=("SpecDecodeBaseProposer.model.model.embed_tokens",),
    ),
    Patch(
        module="vllm_ppspec.sched.draft_delivery",
        when="runner",
        targets=(),
        why=(
            "vLLM's engine core fetches the drafts with a call that waits for the batch "
            "to leave the pipeline, and hands them over before that batch's tokens"
        ),
        how=(
            "attach_drafts(output, drafts), from the last rank's sync steps: the batch's "
            "drafts set on its ModelRunnerOutput (a new attribute, pickled with it), read by "
            "the plugin's sync scheduler; never on vLLM's shared EMPTY_MODEL_RUNNER_OUTPUT; "
            "with the draft model on the first stage they are placeholder slots, marked so"
        ),
        upstream="none found; vllm/v1/engine/core.py:EngineCore.post_step",
        remove_when="vLLM delivers each batch's drafts with its output under PP",
        install=None,
        attributes=(
            "ModelRunnerOutput.ppspec_draft_token_ids",
            "ModelRunnerOutput.ppspec_placeholder_drafts",
        ),
    ),
)
