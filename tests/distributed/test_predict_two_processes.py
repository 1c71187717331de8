"""``trainer.predict`` over 2 real processes gives what it gives in 1, in data-set order, on both.

13 samples in batches of 4 split 7 / 6 over the processes (strided), the sequences of the ragged
case are padded to a different length in each batch, and 1 sample leaves the second process
with only a padding batch of zero rows. The 1-process reference runs the worker's own factories here, and a
plain-PyTorch oracle checks the nested case.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

from tests.launch import launch_workers, load_worker_module


@pytest.fixture(scope="module")
def worker() -> ModuleType:
    return load_worker_module("predict_worker")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return launch_workers("predict_worker.py", tmp_path_factory.mktemp("predict"), nproc=2).results


def one_process_predictions(worker: ModuleType, case: str) -> Any:
    trainer, dataset, kwargs = worker.make_case(case)
    return worker.to_lists(trainer.predict(dataset, **kwargs))


def test_worker_ran_as_a_group_of_two_processes(ranks: list[dict[str, Any]]) -> None:
    assert [result["world_size"] for result in ranks] == [2, 2]


@pytest.mark.parametrize("case", ["nested", "ragged", "ragged_padding", "one_sample"])
def test_both_ranks_get_the_whole_result_on_the_cpu(ranks: list[dict[str, Any]], case: str) -> None:
    assert ranks[0][case] == ranks[1][case]
    assert ranks[0][f"{case}_on_cpu"] and ranks[1][f"{case}_on_cpu"]


@pytest.mark.parametrize("case", ["nested", "ragged", "ragged_padding", "one_sample"])
def test_two_processes_predict_what_one_process_predicts_in_order(
    ranks: list[dict[str, Any]], worker: ModuleType, case: str
) -> None:
    expected = one_process_predictions(worker, case)
    if case.startswith("ragged"):  # integers times 2 plus 1: exact
        assert ranks[0][case] == expected
        return
    # The same rows, computed in batches of other sizes (and here with another number of threads
    # than the workers' one): equal up to float rounding; the argmax exactly.
    got = ranks[0][case]
    torch.testing.assert_close(torch.tensor(got["logits"]), torch.tensor(expected["logits"]))
    assert got["extra"][0] == expected["extra"][0]
    torch.testing.assert_close(torch.tensor(got["extra"][1]), torch.tensor(expected["extra"][1]))


def test_nested_predictions_are_the_model_outputs_of_each_sample_in_order(
    ranks: list[dict[str, Any]], worker: ModuleType
) -> None:
    trainer, dataset, _ = worker.make_case("nested")
    with torch.no_grad():
        logits = trainer.model(dataset.tensors[0])["logits"]
    predicted = torch.tensor(ranks[0]["nested"]["logits"])
    assert predicted.shape == (13, 2)
    torch.testing.assert_close(predicted, logits)
    assert ranks[0]["nested"]["extra"][0] == logits.argmax(dim=1).tolist()


@pytest.mark.parametrize(("case", "num_samples"), [("ragged", 13), ("ragged_padding", 3)])
def test_ragged_sequences_are_padded_to_the_longest_with_the_padding_value(
    ranks: list[dict[str, Any]], worker: ModuleType, case: str, num_samples: int
) -> None:
    longest = max(worker.sequence_length(index) for index in range(num_samples))
    expected = []
    for index in range(num_samples):
        tokens = worker.Sequences(num_samples)[index].tolist()
        row = [2.0 * token + 1 for token in tokens]
        expected.append(row + [float(worker.PADDING_VALUE)] * (longest - len(row)))
    assert ranks[0][case] == expected


def test_after_train_both_ranks_predict_with_the_trained_model_in_order(ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        after = result["after_train"]
        torch.testing.assert_close(torch.tensor(after["predictions"]), torch.tensor(after["by_hand"]))
        assert after["eval_dataset_kept"]
    assert ranks[0]["after_train"]["predictions"] == ranks[1]["after_train"]["predictions"]
