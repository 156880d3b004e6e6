//! Task drivers behind one trait.
