"""Datasets: MNIST / Fashion-MNIST / CelebA into ``{train,test}.npz`` and the facts about them."""
