"""The VERL entry point: VERL's PPO trainer with agl-lite in place of its rollout generation, as Agent Lightning's
VERL bridge does. Each step: sync the weights into VERL's vLLM servers with the gateway held (`weight_sync`),
run the batch's prompts as agl-lite rollouts (`BlockingDaemon.step`), then VERL's own log-prob, reference, value,
advantage and update steps on the daemon's batch; rows with an over-long prompt are dropped after advantages.

Written against verl 0.9.1's `RayPPOTrainer` (its legacy, non-TransferQueue loop). It needs GPUs and the whole of
verl: the tests here stop where this trainer takes the batch (`tests/integrations/verl/test_dataproto.py`).
Run: `python -m agl_lite.integrations.verl.trainer` with VERL's Hydra config plus an `agl_lite:` section
(docs/training.md).
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from verl.trainer.ppo.ray_trainer import (
    RayPPOTrainer,
    apply_kl_penalty,
    compute_advantage,
)
from verl.utils.metric import reduce_metrics
from verl.utils.tracking import Tracking

from agl_lite.integrations.verl.blocking import BlockingDaemon
from agl_lite.integrations.verl.daemon import DaemonConfig
from agl_lite.integrations.verl.dataproto import to_dataproto
from agl_lite.integrations.verl.dataset import daemon_config, samples_of
from agl_lite.integrations.verl.update import drop_and_fit

__all__ = ["AglLiteTrainer", "main"]


class AglLiteTrainer(RayPPOTrainer):  # type: ignore[misc]
    """`RayPPOTrainer` whose `fit` takes its rollouts from agl-lite."""

    def fit(self) -> None:
        config = self.config
        logger = Tracking(
            project_name=config.trainer.project_name,
            experiment_name=config.trainer.experiment_name,
            default_backend=config.trainer.logger,
            config=OmegaConf.to_container(config, resolve=True),
        )
        tokenizer = self.tokenizer
        settings = daemon_config(config)
        if tokenizer.pad_token_id is not None:
            settings = DaemonConfig(**{**settings.__dict__, "pad_token_id": tokenizer.pad_token_id})
        daemon = BlockingDaemon(
            config.agl_lite.get("url") or os.environ.get("AGL_URL"),
            os.environ.get("AGL_KEY"),
            settings,
            decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False),
        )
        self.global_steps = 0
        self._load_checkpoint()
        endpoints = [f"http://{a}/v1" for a in self.llm_server_manager.server_addresses]
        with daemon:
            with daemon.weight_sync(endpoints, "step-0"):
                self.checkpoint_manager.update_weights(self.global_steps)
            self.global_steps = 1
            for _epoch in range(config.trainer.total_epochs):
                for batch_dict in self.train_dataloader:
                    metrics = self._agl_step(daemon, DataProto.from_single_dict(batch_dict))
                    with daemon.weight_sync(endpoints, f"step-{self.global_steps}"):
                        self.checkpoint_manager.update_weights(self.global_steps)
                    logger.log(data=metrics, step=self.global_steps)
                    if config.trainer.save_freq > 0 and self.global_steps % config.trainer.save_freq == 0:
                        self._save_checkpoint()
                    if self.global_steps >= self.total_training_steps:
                        return
                    self.global_steps += 1

    def _agl_step(self, daemon: BlockingDaemon, prompts: DataProto) -> dict[str, float]:
        config = self.config
        result = daemon.step(samples_of(prompts.non_tensor_batch))
        self.checkpoint_manager.sleep_replicas()  # free the servers' memory for training, as VERL's loop does
        metrics = result.metrics.as_dict()
        batch = to_dataproto(result.batch)
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(dim=-1).tolist()
        batch.meta_info["temperature"] = config.actor_rollout_ref.rollout.temperature
        batch, pad = pad_dataproto_to_divisor(batch, self.actor_rollout_wg.world_size)
        old_log_prob, _ = self._compute_old_log_prob(batch)
        old_log_prob.batch.pop("entropys", None)
        batch = batch.union(old_log_prob)
        if self.use_reference_policy:
            batch = batch.union(self._compute_ref_log_prob(batch))
        if self.use_critic:
            batch = batch.union(self._compute_values(batch))
        batch = unpad_dataproto(batch, pad_size=pad)  # advantages on the real rows only
        if config.algorithm.use_kl_in_reward:
            batch, kl_metrics = apply_kl_penalty(
                batch, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=config.algorithm.kl_penalty
            )
            metrics.update(kl_metrics)
        else:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        batch = compute_advantage(
            batch,
            adv_estimator=config.algorithm.adv_estimator,
            gamma=config.algorithm.gamma,
            lam=config.algorithm.lam,
            num_repeat=config.actor_rollout_ref.rollout.n,
            norm_adv_by_std_in_grpo=config.algorithm.get("norm_adv_by_std_in_grpo", True),
            config=config.algorithm,
        )
        batch, fit_metrics = drop_and_fit(
            batch, config.actor_rollout_ref.actor.ppo_mini_batch_size, seed=self.global_steps
        )
        metrics.update(fit_metrics)
        if self.use_critic:
            metrics.update(reduce_metrics(self._update_critic(batch).meta_info["metrics"]))
        if config.trainer.critic_warmup <= self.global_steps:
            metrics.update(reduce_metrics(self._update_actor(batch).meta_info["metrics"]))
        return metrics


def _runner_class() -> Any:
    """VERL's (legacy) task runner, as a Ray actor that builds `AglLiteTrainer` instead of `RayPPOTrainer`. The
    swap happens inside the actor's process, where VERL's runner looks the trainer class up when it runs."""
    import ray
    from verl.trainer import main_ppo_v0

    verl_runner = main_ppo_v0.TaskRunner.__ray_metadata__.modified_class.__ray_actor_class__

    class AglLiteTaskRunner(verl_runner):  # type: ignore[misc,valid-type]
        def run(self, config: DictConfig) -> None:
            main_ppo_v0.RayPPOTrainer = AglLiteTrainer
            super().run(config)

    return ray.remote(AglLiteTaskRunner)


def main() -> None:
    """Hydra entry: VERL's `ppo_trainer` config with an `agl_lite:` section."""
    import hydra
    from verl.trainer.main_ppo import run_ppo

    @hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)  # type: ignore[untyped-decorator]
    def run(config: DictConfig) -> None:
        run_ppo(config, task_runner_class=_runner_class())

    run()


if __name__ == "__main__":
    main()
