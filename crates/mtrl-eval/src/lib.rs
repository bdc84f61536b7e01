//! `mtrl-eval`: evaluation jobs and what a run leaves behind to read.
//!
//! (Module docs are filled in by the modules' authors.)

pub mod error;
