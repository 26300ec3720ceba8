// plan_report.h: the printed comparisons of `plan --published` (plan_published.h's runs beside the
// planner's predictions), one table per source, and the verdict of each check. Defines
// PublishedChecks (what held) and print_published_comparisons().
#pragma once

// Calibrates the efficiency on Megatron-Core's 177B row, predicts every other run from it and prints
// each comparison side by side: Megatron-Core on H100 (within 15%), Llama 3 405B's Table 4 (within
// 15%, and where its (TP, CP, PP, DP) stands in the planner's own search), GPT-OSS 120B (within
// 25%), torchtitan's CP scaling (ratios to CP 1 within 25%), DeepSeek-V3 (fits in 80 GB, by category;
// GPU hours per trillion tokens beside 180K). `default_efficiency`: the constant plan uses, to say
// whether it still agrees. 0 when every check holds, else 1.
int print_published_comparisons(double default_efficiency);
