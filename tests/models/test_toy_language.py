import pytest
import torch

from workbench.models.toy_language import ToyLanguageDataset, ToyTokenizer


def test_tokenizer_round_trip_and_unknown_words():
    t = ToyTokenizer()
    ids = t.encode("<bos> red <sep> apple sky <eos>")
    assert ids == [1, 4, 2, 8, 10, 3] and t.decode(ids) == "<bos> red <sep> apple sky <eos>"
    assert t.decode(ids, skip_special=True) == "red apple sky"
    with pytest.raises(ValueError, match="Unknown token 'banana'"):
        t.encode("banana")


def test_collate_by_hand():
    d = ToyLanguageDataset(size=4, utterance_length=4)
    t = d.tokenizer
    seqs = torch.tensor([t.encode("<bos> red <sep> apple sky rose <eos> <pad>"),
                         t.encode("<bos> gold <sep> coin <eos> <pad> <pad> <pad>")])
    b = d.collate(seqs)
    assert b["action_idxs"].tolist() == [[2, 3, 4, 5, 0], [2, 3, 0, 0, 0]]
    assert b["state_idxs"].tolist() == [[2, 3, 4, 5, 6, 0], [2, 3, 4, 0, 0, 0]]
    # apple and rose fit red (1 each, when said); sky does not; coin fits gold
    assert b["rewards"].tolist() == [[1, 0, 1, 0, 0], [1, 0, 0, 0, 0]]
    assert b["terminals"].tolist() == [[0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 1, 1]]
    assert b["attn_mask"].tolist() == [[1] * 7 + [0], [1] * 5 + [0] * 3]
    assert d.score(seqs).tolist() == [2.0, 1.0]
    # words after <eos> or beyond L, and non-words, earn nothing
    late = torch.tensor([t.encode("<bos> red <sep> <eos> apple apple apple <pad>"),
                         t.encode("<bos> red <sep> red apple apple apple apple")])
    assert d.score(late).tolist() == [0.0, 3.0]


def test_behaviour_policy_is_mediocre_as_specified():
    d = ToyLanguageDataset(size=20_000, utterance_length=4, p_good=0.3, p_stop=0.1, seed=1)
    words = d.data["attn_mask"][:, 3:].sum(1) - 1  # answer tokens minus <eos>
    # stops before word k (k = 2..4) with probability 0.1 each: E[words] = sum_k P(reach k)
    expected_words = 1 + 0.9 + 0.81 + 0.729
    assert words.float().mean().item() == pytest.approx(expected_words, rel=0.02)
    fit = 0.3 + 0.7 * 2 / 8
    assert d.behaviour_reward == pytest.approx(fit * expected_words, rel=0.02)
    assert d.behaviour_reward < 0.5 * d.utterance_length  # plenty of room above it


def test_bad_dataset_arguments():
    with pytest.raises(ValueError, match="p_stop"):
        ToyLanguageDataset(p_stop=1.0)
