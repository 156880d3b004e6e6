//! The per-task supervisor process.
