"""Model + data + loss + metric bundles (classification, detection, lm, user tasks)."""
