//! C emission from kernel IR (being written).
