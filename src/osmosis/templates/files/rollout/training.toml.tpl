# Train on <your-rollout>: `osmosis train submit configs/training/<your-rollout>.toml`.
[experiment]
rollout = "<your-rollout>"
entrypoint = "main.py"
model_path = "<your-base-model>"    # a base model the training platform supports
dataset = "<your-rollout>"

[training]
# Omit a value to use the platform's default.
# lr = 1e-6
# total_epochs = 1
# n_samples_per_prompt = 8
# rollout_batch_size = 32
# max_prompt_length = 8192
# max_response_length = 8192
# agent_workflow_timeout_s = 450
# grader_timeout_s = 150

[sampling]
# rollout_temperature = 1.0
# rollout_top_p = 1.0

[checkpoints]
# eval_interval = 10
# checkpoint_save_freq = 20
