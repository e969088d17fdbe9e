//! Test support for the PostgreSQL store: a throwaway database per test. Not meant for production.

/// A database of its own for one test run, on the PostgreSQL server named by `SEALGATE_TEST_POSTGRES`
/// (default the local one with trust auth, database `test`); dropped, with its connections, when the
/// value is dropped (declare it before the stores or gateways that use it). Used by the PostgreSQL store's
/// unit tests and by the black-box replica tests.
pub struct TestDatabase {
    admin: String,
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    pub async fn create() -> TestDatabase {
        let admin = std::env::var("SEALGATE_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let name = format!("sealgate_test_{}", uuid::Uuid::new_v4().simple());
        let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL for the tests (SEALGATE_TEST_POSTGRES)");
        tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        // Same server and user, another database: replace the path of the URL.
        let server = admin.rsplit_once('/').map_or(admin.as_str(), |(s, _)| s);
        let url = format!("{server}/{name}");
        TestDatabase { admin, name, url }
    }

    /// Runs `sql` on the test database itself (say, to kill the gateways' connections).
    pub async fn execute(&self, sql: &str) {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client.batch_execute(sql).await.unwrap();
    }
}

impl TestDatabase {
    /// Runs `sql` on the server's admin database (say, to refuse connections to the test database);
    /// `{db}` in `sql` stands for the test database's name.
    pub async fn admin_execute(&self, sql: &str) {
        let (client, connection) = tokio_postgres::connect(&self.admin, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&sql.replace("{db}", &self.name))
            .await
            .unwrap();
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        // Drop is not async: a thread with a runtime of its own does the round trip.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
                    .await
                    .ok()?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("test database {} was not dropped", self.name);
        }
    }
}
