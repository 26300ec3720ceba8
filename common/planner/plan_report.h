// plan_report.h: the printed comparisons of `plan --published` (plan_published.h's runs beside the
// planner's predictions), one table per source, and the verdict of each check. Defines
// PublishedChecks (what held), print_published_comparisons() and print_kernel_rates().
#pragma once

// Calibrates the efficiency on Megatron-Core's 177B row, predicts every other run from it and prints
// each comparison side by side, every row with the `plan --one` command that reproduces it:
// Megatron-Core on H100, Llama 3 405B's Table 4 (and where its (TP, CP, PP, DP) stands in the
// planner's own search), torchtitan's CP scaling (ratios to CP 1) and measured memory peaks, all
// within kPublishedTolerance; GPT-OSS 120B's tokens/s and DeepSeek-V3's GPU hours per trillion tokens
// within kPublishedMoeTolerance (and its memory by category). `default_efficiency`: the constant plan
// uses, to say whether it still agrees. 0 when every check holds or misses with its stated reason
// (PublishedRun::exception, each printed last with its reason), else 1, the misses named last; a stated
// exception that holds is stale and fails too.
int print_published_comparisons(double default_efficiency);

// `plan --kernel-rates`: the kernel-rate tables (planner_kernel_rates.h) as the planner reads them, per
// GPU: the dense products' share of peak by contraction depth, flash attention's by kernel, head size
// and sequence, the grouped experts' factor by rows per expert; each with its source. Returns 0.
int print_kernel_rates();
