"""The pinned vLLM source tree: the sdist, the patch series, the FetchContent sources its
CMake clones, and the tree the recipe's own scripts fetch and patch."""
