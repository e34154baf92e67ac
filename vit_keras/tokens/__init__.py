"""A token budget for a trained ViT: token merging (ToMe) and pruning (EViT) between each
block's attention and its MLP, with static shapes so that the exports carry them.
reduction holds the rules and the layers that apply them; budget builds them into a model.
"""
