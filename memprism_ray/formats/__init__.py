"""Plain data formats that layers above and below each other share (the short text history a
policy and a flat-history renderer read, the Mind2Web snapshot lines a policy and a Phi
parse). They sit at the bottom of the layer order and import nothing from memprism_ray."""
