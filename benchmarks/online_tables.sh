#!/usr/bin/env bash
# Regenerate the merged online-protocol tables and figures (docs/benchmarks/online.md) from the
# runs. Their curves (*.csv.gz) are not committed: regenerate them first (benchmarks/README.md).
#
# Each directory below is one run of benchmarks/online_regression.py or
# online_classification.py (a subset of datasets, models or trials; see its JSON).
# Order matters: a later run of the same dataset, model and trial replaces an earlier one.
# Elevators' 200-step pretraining runs (online_regression_elevators_full/ and its trials in
# online_regression_trials/) are replaced by the 1,000-step ones listed after them.
set -euo pipefail
cd "$(dirname "$0")/.."
R=benchmarks/results
PYTHON=${PYTHON:-python}

regression=(
  skillcraft_full powerplant_full exact_projected trials baselines_trials12 exact_trials12
  elevators_pretrain1000 elevators_pretrain1000_baselines elevators_pretrain1000_baselines_trial2
  elevators_pretrain1000_exact elevators_pretrain1000_exact12
  protein_full protein_trials protein_trials12 protein_osvgp protein_osvgp_trial1
  protein_osvgp_trial2
)
classification=(
  full banana_trials svmguide1_trials svmguide1_exact_trials12
  svmguide1_exact_projected_trial1 svmguide1_exact_projected_trial2
)

inputs=()
for run in "${regression[@]}"; do inputs+=("$R/online_regression_$run/online_regression.csv.gz"); done
"$PYTHON" benchmarks/stream_table.py "${inputs[@]}" --at 2000 --out $R/online_regression_table
"$PYTHON" benchmarks/compare_at_cap.py "${inputs[@]}" --out $R/online_regression_table

inputs=()
for run in "${classification[@]}"; do
  inputs+=("$R/online_classification_$run/online_classification.csv.gz")
done
"$PYTHON" benchmarks/stream_table.py "${inputs[@]}" --at 2000 --out $R/online_classification_table
