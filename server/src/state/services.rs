//! The Nomad-native service registrations table.

use std::sync::Arc;

use nomad_proto::ServiceRegistration;

use super::{Change, State, Table, Txn, Watch};

impl State {
    /// Every registration, ordered by ID.
    pub fn service_registrations(&self) -> impl Iterator<Item = &Arc<ServiceRegistration>> {
        self.services.values()
    }

    /// One registration by ID.
    pub fn service_registration(&self, id: &str) -> Option<&Arc<ServiceRegistration>> {
        self.services.get(id)
    }

    /// Registrations of one service in a namespace (`None`: all namespaces).
    pub fn service_registrations_by_name<'a>(
        &'a self,
        namespace: Option<&'a str>,
        name: &'a str,
    ) -> impl Iterator<Item = &'a Arc<ServiceRegistration>> + 'a {
        self.services.values().filter(move |s| s.service_name == name && namespace.is_none_or(|n| s.namespace == n))
    }
}

impl Txn<'_> {
    /// Inserts or updates registrations.
    pub fn upsert_service_registrations(&mut self, regs: &[ServiceRegistration]) {
        for r in regs {
            let mut r = r.clone();
            r.create_index = self.state.services.get(&r.id).map_or(self.index, |old| old.create_index);
            r.modify_index = self.index;
            let r = Arc::new(r);
            self.state.services.insert(r.id.clone(), r.clone());
            self.touch(Table::Services);
            self.touch_key(Watch::Service(r.service_name.clone()));
            self.record(Change::Service(r));
        }
    }

    /// Removes the registrations matching `pred`.
    pub fn delete_service_registrations(&mut self, pred: impl Fn(&ServiceRegistration) -> bool) {
        let gone: Vec<Arc<ServiceRegistration>> = self.state.services.values().filter(|s| pred(s)).cloned().collect();
        for s in gone {
            self.state.services.remove(&s.id);
            self.touch(Table::Services);
            self.touch_key(Watch::Service(s.service_name.clone()));
            self.record(Change::ServiceDeleted(s));
        }
    }
}
