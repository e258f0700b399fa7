//! Placeholder: the Consumer lands here.
