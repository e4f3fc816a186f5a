import workbench


def test_perturbed_policy_beats_the_behaviour_data_after_offline_training():
    exp = workbench.experiments.create("ilql", seed=0, eval_every=0, dataset_size=1024)
    before = exp.evaluate(prompts=256)
    metrics = [exp.step() for _ in range(200)]
    after = exp.evaluate(prompts=256)
    assert {"loss", "token_loss", "v_loss", "q_loss", "cql_loss", "dm_loss", "mean_q", "mean_v",
            "mean_advantage"} <= metrics[-1].keys()
    assert metrics[-1]["token_loss"] < metrics[0]["token_loss"]
    # the behaviour policy says ~1.6 fitting words of 4; ILQL's perturbed policy must do far better
    assert after["policy_reward"] > after["behaviour_reward"] + 1.0
    assert after["policy_reward"] > before["policy_reward"] + 1.0


def test_evaluation_every_n_steps_reports_rewards_side_by_side():
    exp = workbench.experiments.create("ilql", seed=1, eval_every=2, eval_prompts=16, dataset_size=64, batch_size=8)
    rows = exp.run(4, modules="model.h.0.*")
    assert "policy_reward" not in rows[0] and {"policy_reward", "bc_reward", "behaviour_reward"} <= rows[1].keys()
    metrics = exp.watcher.metrics()
    assert metrics["policy_reward"].isna().tolist() == [True, False, True, False]
    assert set(exp.watcher.to_pandas().kind) >= {"activation", "grad_output", "param_grad"}
    # the evaluation decodes with the model inside steps 2 and 4: the watch stays out of it, so those
    # steps record the training step's call sites and nothing more
    recorded = exp.watcher.to_pandas()
    keys = {step: set(zip(part.module, part.call, part.kind, part.tensor)) for step, part in recorded.groupby("step")}
    assert keys[1] == keys[2] == keys[3] == keys[4]


def test_an_evaluation_between_steps_is_not_recorded_into_the_next_step():
    exp = workbench.experiments.create("ilql", seed=1, eval_every=0, eval_prompts=8, dataset_size=64, batch_size=8)
    with exp.watch(modules="model.h.0.*") as w:
        exp.step()
        exp.evaluate()
        exp.step()
    recorded = w.to_pandas()
    assert len(recorded[recorded.step == 1]) == len(recorded[recorded.step == 2]) > 0
