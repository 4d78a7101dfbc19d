package dev.imgest.bulk;

import com.datastax.driver.core.AuthProvider;
import com.datastax.driver.core.BoundStatement;
import com.datastax.driver.core.Cluster;
import com.datastax.driver.core.ConsistencyLevel;
import com.datastax.driver.core.Host;
import com.datastax.driver.core.Metadata;
import com.datastax.driver.core.NettyOptions;
import com.datastax.driver.core.PlainTextAuthProvider;
import com.datastax.driver.core.PreparedStatement;
import com.datastax.driver.core.ProtocolVersion;
import com.datastax.driver.core.RemoteEndpointAwareJdkSSLOptions;
import com.datastax.driver.core.SSLOptions;
import com.datastax.driver.core.ResultSetFuture;
import com.datastax.driver.core.Session;
import com.datastax.driver.core.SocketOptions;
import com.datastax.driver.core.TokenRange;
import com.datastax.driver.core.exceptions.InvalidQueryException;
import com.datastax.driver.core.exceptions.NoHostAvailableException;
import com.datastax.driver.core.exceptions.OperationTimedOutException;
import com.datastax.driver.core.exceptions.OverloadedException;
import com.datastax.driver.core.exceptions.UnavailableException;
import com.datastax.driver.core.exceptions.WriteTimeoutException;
import com.datastax.driver.core.policies.DCAwareRoundRobinPolicy;
import com.datastax.driver.core.policies.TokenAwarePolicy;
import com.datastax.shaded.netty.channel.EventLoopGroup;
import com.datastax.shaded.netty.channel.socket.SocketChannel;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayInputStream;
import java.io.EOFException;
import java.io.FileDescriptor;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.lang.reflect.Constructor;
import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ReadableByteChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.spec.PKCS8EncodedKeySpec;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Pattern;
import javax.net.ssl.KeyManager;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.TrustManagerFactory;
import org.apache.cassandra.config.DatabaseDescriptor;
import org.apache.cassandra.cql3.statements.schema.CreateTableStatement;
import org.apache.cassandra.config.EncryptionOptions.ServerEncryptionOptions;
import org.apache.cassandra.dht.IPartitioner;
import org.apache.cassandra.dht.Range;
import org.apache.cassandra.dht.Token;
import org.apache.cassandra.io.sstable.CQLSSTableWriter;
import org.apache.cassandra.io.sstable.SSTableLoader;
import org.apache.cassandra.io.util.File;
import org.apache.cassandra.locator.InetAddressAndPort;
import org.apache.cassandra.schema.TableId;
import org.apache.cassandra.schema.TableMetadata;
import org.apache.cassandra.schema.TableMetadataRef;
import org.apache.cassandra.schema.Types;
import org.apache.cassandra.streaming.StreamResultFuture;
import org.apache.cassandra.streaming.StreamingChannel;
import org.apache.cassandra.utils.FBUtilities;
import org.apache.cassandra.utils.NativeSSTableLoaderClient;
import org.apache.cassandra.utils.OutputHandler;
import org.apache.cassandra.utils.StorageCompatibilityMode;

/**
 * imgest's bulk-load helper: rows in, SSTables out, streamed into the cluster.
 *
 * <p>Reads from stdin a JSON header (u32 length + UTF-8) naming the scratch folder, the partitioner, the
 * tables (CREATE and INSERT statements, in load order: data tables before metadata tables) and the loader's
 * settings; then commands, each one byte: 'R' a row (u8 table index, u16 column count, per column an i32
 * length, -1 for null, and the value serialized as CQL does), 'L' close the SSTables written so far and stream
 * them table by table to every replica of their ranges (sstableloader's SSTableLoader), 'Q' quit once every
 * round is streamed; 'T' (the build's training run, bulk_archive.py) writes the round's SSTables and drops them,
 * answered "OK rows 0". A round's SSTables are written (its writers closed) on one background thread and streamed
 * on another, rounds in the order of their 'L': a round is closed while the one before it streams (the node takes
 * most of a stream's time), and the next one's rows arrive meanwhile. Each 'L' is answered on stdout, when its round is on every replica, with one line
 * "OK rows seconds" (the seconds its streaming took), or "ERROR message", after which the helper exits; logs go
 * to stderr. Credentials and the CA travel in the header, never in argv.
 *
 * <p>With "mode": "cql" in the header the helper writes through CQL instead (CqlRows): each 'R' row is bound to the
 * prepared statement of its index (the header's "tables", each {"insert": ...}) and sent by the DataStax Java driver,
 * and 'L' is answered once every row before it has been answered by the cluster.
 */
public final class BulkWriter {
    private final JsonNode cfg;
    private final Path scratch;
    private final List<JsonNode> tables = new ArrayList<>();
    private CQLSSTableWriter[] writers;
    private long[] pending;
    private int round;
    private SSTableLoader.Client client; // the streaming thread's, after readRingAhead hands it over
    private final Slabs slabs = new Slabs();
    /** Closes the rounds' writers (each sorts and writes its SSTables), one at a time, in order. */
    private final ExecutorService closer = Executors.newSingleThreadExecutor(r -> {
        Thread t = new Thread(r, "imgest-close");
        t.setDaemon(true);
        return t;
    });
    /** Streams the closed rounds, one at a time, in order, while the next round is closed and the one after written. */
    private final ExecutorService streamer = Executors.newSingleThreadExecutor(r -> {
        Thread t = new Thread(r, "imgest-stream");
        t.setDaemon(true);
        return t;
    });

    private BulkWriter(JsonNode cfg) {
        this.cfg = cfg;
        this.scratch = Path.of(cfg.get("dir").asText());
        cfg.get("tables").forEach(tables::add);
        this.writers = new CQLSSTableWriter[tables.size()];
        this.pending = new long[tables.size()];
    }

    public static void main(String[] args) throws Exception {
        PrintStream replies = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
        System.setOut(System.err); // Cassandra's tool code prints: stdout carries the replies only
        Frames in = new Frames(new FileInputStream(FileDescriptor.in).getChannel());
        try {
            byte[] header = new byte[in.i32()];
            in.fill(ByteBuffer.wrap(header));
            JsonNode parsed = new ObjectMapper().readTree(header);
            if (parsed.path("mode").asText("bulk").equals("cql")) {
                new CqlRows(parsed).run(in, replies);
                System.exit(0);
            }
            BulkWriter w = new BulkWriter(parsed);
            sstableVersionOf(w.cfg.path("storage_compatibility_mode").asText("CASSANDRA_4"));
            DatabaseDescriptor.clientInitialization();
            DatabaseDescriptor.setStreamThroughputOutboundBytesPerSec(0); // unthrottled; the tool's default is 24 MiB/s
            DatabaseDescriptor.setEntireSSTableStreamThroughputOutboundMebibytesPerSec(0);
            w.readRingAhead();
            w.run(in, replies);
        } catch (Throwable t) {
            replies.println("ERROR " + describe(t));
            t.printStackTrace(System.err);
            System.exit(1);
        }
        System.exit(0); // the streaming threads are not daemons
    }

    /** Write the SSTable version the nodes write. Client mode forces storage_compatibility_mode NONE, so
     * CQLSSTableWriter would write 5.0's "oa" files, and a 5.0 node in CASSANDRA_4 mode (its default) streams them
     * in but then refuses to start ("Detected unreadable sstables"). The big format's version is fixed when its
     * class is initialized: initialize it first, under the nodes' mode. */
    private static void sstableVersionOf(String mode) throws Exception {
        java.lang.reflect.Field field = DatabaseDescriptor.class.getDeclaredField("storageCompatibilityMode");
        field.setAccessible(true);
        field.set(null, StorageCompatibilityMode.valueOf(mode));
        Class.forName("org.apache.cassandra.io.sstable.format.big.BigFormat$BigVersion", true,
                BulkWriter.class.getClassLoader());
    }

    private static String describe(Throwable t) {
        StringBuilder sb = new StringBuilder();
        for (Throwable c = t; c != null; c = c.getCause()) {
            if (sb.length() > 0) sb.append(" <- ");
            sb.append(c.getClass().getSimpleName()).append(": ").append(String.valueOf(c.getMessage()).replace('\n', ' '));
            if (c.getCause() == c) break;
        }
        return sb.toString();
    }

    /** Read the ring while the first rows arrive: the loader's driver takes seconds to connect and to close. A
     * failure here is not fatal: the first load reads the ring again and reports what went wrong. */
    private void readRingAhead() throws Exception {
        RingOnce ring = new RingOnce(externalClient(cfg.get("loader")), cfg.get("loader").get("ring"),
                cfg.get("partitioner").asText());
        client = ring;
        Thread t = new Thread(() -> {
            try {
                ring.init(cfg.get("keyspace").asText());
            } catch (RuntimeException e) {
                System.err.println("imgest bulk: reading the ring ahead failed: " + describe(e));
            }
        }, "imgest-ring-ahead");
        t.setDaemon(true);
        t.start();
    }

    private void run(Frames in, PrintStream replies) throws Exception {
        while (true) {
            int op;
            try {
                op = in.u8();
            } catch (EOFException eof) {
                return; // the caller went away: what was not loaded was never acknowledged
            }
            switch (op) {
                case 'R' -> row(in);
                case 'L' -> {
                    Round handed = nextRound();
                    closer.execute(() -> closeThenStream(handed, replies));
                }
                case 'T' -> {
                    Round handed = nextRound();
                    long rows = closeWriters(handed);
                    deleteTree(handed.dir());
                    replies.printf("OK %d 0%n", rows);
                }
                case 'Q' -> {
                    closer.shutdown(); // the rounds already asked for are closed, streamed and answered first
                    closer.awaitTermination(1, TimeUnit.DAYS);
                    streamer.shutdown();
                    streamer.awaitTermination(1, TimeUnit.DAYS);
                    return;
                }
                default -> throw new IOException("unknown command byte " + op);
            }
        }
    }

    private void row(Frames in) throws Exception {
        int t = in.u8();
        int n = in.u16();
        ByteBuffer[] values = new ByteBuffer[n];
        for (int i = 0; i < n; i++) {
            int len = in.i32();
            if (len < 0) continue;
            ByteBuffer value = len >= Slabs.FROM_BYTES ? slabs.take(len) : ByteBuffer.allocate(len);
            in.fill(value);
            values[i] = value;
        }
        writer(t).rawAddRow(values);
        pending[t]++;
    }

    /**
     * CQL mode: rows go to the cluster as requests of the DataStax Java driver (token-aware, the header's consistency
     * level), at most "max_in_flight" at once: reading the next row waits for a free slot, so the pipe holds the
     * caller back. A request that times out, finds too few replicas or an overloaded node is sent again after
     * "backoff_s" x 2^attempt, up to "retries" times. The values' bytes in flight are capped too ("max_in_flight_bytes",
     * ImageWriter's budget: 64 requests of 31 MiB images would not fit the heap); a request waits "timeout_s" for its
     * answer, as the Python driver's does. Each 'L' closes a round: once every
     * row of it is answered, the
     * reply is one line "BAD index too_large|error message" per row that failed for good (index: its place in the
     * round), then "OK rows 0 retries" (the round's rows, failed ones included; the resends since the last reply).
     */
    static final class CqlRows {
        private static final Pattern TOO_LARGE =
                Pattern.compile("oversized mutation|exceeds allowed maximum|too large|larger than", Pattern.CASE_INSENSITIVE);
        private final Cluster cluster;
        private final Session session;
        private final PreparedStatement[] statements;
        private final Semaphore window;
        private final Semaphore kib; // KiB of value bytes in flight
        private final int kibCap;
        private final int retries;
        private final double backoff;
        private final AtomicLong resent = new AtomicLong();
        private final ScheduledExecutorService timers = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "imgest-cql-retry");
            t.setDaemon(true);
            return t;
        });
        /** Answers the rounds in the order of their 'L', each once all its rows are answered. */
        private final ExecutorService replier = Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, "imgest-cql-reply");
            t.setDaemon(true);
            return t;
        });
        private CqlRound current = new CqlRound();

        /** One round's rows: outstanding counts the unanswered ones, plus one until the round's 'L'. */
        static final class CqlRound {
            final AtomicInteger outstanding = new AtomicInteger(1);
            final CompletableFuture<Void> done = new CompletableFuture<>();
            final ConcurrentLinkedQueue<String> bad = new ConcurrentLinkedQueue<>();
            int rows;

            void answered() {
                if (outstanding.decrementAndGet() == 0) done.complete(null);
            }
        }

        CqlRows(JsonNode cfg) throws Exception {
            JsonNode l = cfg.get("loader");
            List<InetSocketAddress> contacts = new ArrayList<>();
            for (JsonNode h : l.get("hosts")) {
                contacts.add(new InetSocketAddress(InetAddress.getByName(h.asText()), l.get("native_port").asInt()));
            }
            DCAwareRoundRobinPolicy.Builder local = DCAwareRoundRobinPolicy.builder();
            if (l.hasNonNull("local_dc")) local.withLocalDc(l.get("local_dc").asText());
            Cluster.Builder builder = Cluster.builder()
                    .addContactPointsWithPorts(contacts)
                    .withProtocolVersion(ProtocolVersion.V4)
                    .withLoadBalancingPolicy(new TokenAwarePolicy(local.build()))
                    .withSocketOptions(new SocketOptions()
                            .setReadTimeoutMillis((int) (cfg.path("timeout_s").asDouble(30) * 1000))
                            .setConnectTimeoutMillis((int) (cfg.path("connect_timeout_s").asDouble(10) * 1000)))
                    .withNettyOptions(QUICK_CLOSE);
            if (l.hasNonNull("user")) {
                builder.withAuthProvider(new PlainTextAuthProvider(l.get("user").asText(), l.get("password").asText()));
            }
            if (l.hasNonNull("ca_pem")) builder.withSSL(sslOptions(l));
            cluster = builder.build();
            session = cluster.connect();
            ConsistencyLevel level = ConsistencyLevel.valueOf(cfg.path("consistency").asText("LOCAL_QUORUM"));
            List<PreparedStatement> prepared = new ArrayList<>();
            for (JsonNode table : cfg.get("tables")) {
                PreparedStatement ps = session.prepare(table.get("insert").asText());
                ps.setConsistencyLevel(level);
                prepared.add(ps);
            }
            statements = prepared.toArray(new PreparedStatement[0]);
            window = new Semaphore(cfg.path("max_in_flight").asInt(64));
            kibCap = (int) Math.max(1, cfg.path("max_in_flight_bytes").asLong(256L << 20) >> 10);
            kib = new Semaphore(kibCap);
            retries = cfg.path("retries").asInt(6);
            backoff = cfg.path("backoff_s").asDouble(0.1);
        }

        void run(Frames in, PrintStream replies) throws Exception {
            try {
                while (true) {
                    int op;
                    try {
                        op = in.u8();
                    } catch (EOFException eof) {
                        return; // the caller went away: nothing after its last answered round was acknowledged
                    }
                    switch (op) {
                        case 'R' -> row(in);
                        case 'L' -> {
                            CqlRound round = current;
                            current = new CqlRound();
                            round.answered(); // its 'L'
                            replier.execute(() -> reply(round, replies));
                        }
                        case 'Q' -> {
                            replier.shutdown();
                            replier.awaitTermination(1, TimeUnit.DAYS);
                            return;
                        }
                        default -> throw new IOException("unknown command byte " + op);
                    }
                }
            } finally {
                cluster.close();
            }
        }

        private void reply(CqlRound round, PrintStream replies) {
            round.done.join();
            StringBuilder out = new StringBuilder();
            for (String b : round.bad) out.append(b).append('\n');
            out.append("OK ").append(round.rows).append(" 0 ").append(resent.getAndSet(0)).append('\n');
            replies.print(out);
            replies.flush();
        }

        private void row(Frames in) throws IOException {
            int t = in.u8();
            int n = in.u16();
            BoundStatement bound = statements[t].bind();
            ByteBuffer key = null;
            int held = 0; // KiB this row holds until it is answered (taken before its bytes are read)
            for (int i = 0; i < n; i++) {
                int len = in.i32();
                if (len < 0) {
                    bound.setBytesUnsafe(i, null);
                    continue;
                }
                int need = Math.min(kibCap - held, (len >> 10) + 1);
                kib.acquireUninterruptibly(need);
                held += need;
                ByteBuffer value = ByteBuffer.allocate(len);
                in.fill(value);
                bound.setBytesUnsafe(i, value);
                if (i == 0) key = value.duplicate();
            }
            bound.setRoutingKey(key); // the image id, both rows' partition key: the request goes to a replica
            window.acquireUninterruptibly();
            CqlRound round = current;
            int index = round.rows++;
            round.outstanding.incrementAndGet();
            send(new Request(bound, round, index, held), 0);
        }

        /** One row on its way: what a resend needs and what its answer gives back. */
        private record Request(BoundStatement bound, CqlRound round, int index, int kib) {}

        private void send(Request r, int attempt) {
            ResultSetFuture future;
            try {
                future = session.executeAsync(r.bound());
            } catch (Throwable e) { // anything thrown: the row is answered (failed), so its round still ends
                failed(e, r, attempt);
                return;
            }
            future.addListener(() -> {
                try {
                    future.getUninterruptibly();
                    answered(r);
                } catch (Throwable e) {
                    failed(e, r, attempt);
                }
            }, Runnable::run);
        }

        private void failed(Throwable e, Request r, int attempt) {
            boolean retryable = e instanceof WriteTimeoutException || e instanceof UnavailableException
                    || e instanceof OperationTimedOutException || e instanceof NoHostAvailableException
                    || e instanceof OverloadedException;
            if (retryable && attempt < retries) {
                try {
                    long delay = (long) (backoff * 1000 * (1L << attempt));
                    timers.schedule(() -> send(r, attempt + 1), delay, TimeUnit.MILLISECONDS);
                    resent.incrementAndGet();
                    return;
                } catch (RuntimeException cannot) { // not resent: reported with the first error
                    e.addSuppressed(cannot);
                }
            }
            boolean tooLarge = e instanceof InvalidQueryException && TOO_LARGE.matcher(String.valueOf(e.getMessage())).find();
            r.round().bad.add("BAD " + r.index() + (tooLarge ? " too_large " : " error ") + describe(e));
            answered(r);
        }

        private void answered(Request r) {
            kib.release(r.kib());
            window.release();
            r.round().answered();
        }
    }

    /** The command stream on stdin, read through one direct buffer; a value is read straight into its own buffer
     * (for an image, its place in the round's slab), so its bytes are copied once, from the pipe. */
    static final class Frames {
        private final ReadableByteChannel channel;
        private final ByteBuffer buf = ByteBuffer.allocateDirect(1 << 20);

        Frames(ReadableByteChannel channel) {
            this.channel = channel;
            buf.flip(); // empty
        }

        private void need(int n) throws IOException {
            if (buf.remaining() >= n) return;
            buf.compact();
            while (buf.position() < n) {
                if (channel.read(buf) < 0) throw new EOFException();
            }
            buf.flip();
        }

        int u8() throws IOException {
            need(1);
            return buf.get() & 0xff;
        }

        int u16() throws IOException {
            need(2);
            return buf.getShort() & 0xffff;
        }

        int i32() throws IOException {
            need(4);
            return buf.getInt();
        }

        /** Fill DST from its position to its limit, then rewind it. */
        void fill(ByteBuffer dst) throws IOException {
            if (buf.hasRemaining()) {
                int take = Math.min(buf.remaining(), dst.remaining());
                dst.put(buf.slice(buf.position(), take));
                buf.position(buf.position() + take);
            }
            while (dst.hasRemaining()) {
                if (channel.read(dst) < 0) throw new EOFException();
            }
            dst.flip();
        }
    }

    /** Direct memory the values of a round live in until its SSTables are written. Off the heap, the collector
     * never copies an image's bytes (on the heap it copied each round's bytes between generations: a fifth of the
     * helper's CPU). A round's chunks go back to the pool once its writers are closed. */
    static final class Slabs {
        static final int FROM_BYTES = 1024; // smaller values (the metadata's) stay on the heap
        static final int CHUNK = 16 << 20;
        private final ConcurrentLinkedQueue<ByteBuffer> free = new ConcurrentLinkedQueue<>();
        private List<ByteBuffer> round = new ArrayList<>();
        private ByteBuffer chunk;

        ByteBuffer take(int len) {
            if (len > CHUNK) return ByteBuffer.allocateDirect(len); // its own; freed by the collector
            if (chunk == null || chunk.remaining() < len) {
                chunk = free.poll();
                if (chunk == null) chunk = ByteBuffer.allocateDirect(CHUNK);
                chunk.clear();
                round.add(chunk);
            }
            ByteBuffer value = chunk.slice(chunk.position(), len);
            chunk.position(chunk.position() + len);
            return value;
        }

        /** This round's chunks (handed to the streaming thread with its writers); the next round starts new ones. */
        List<ByteBuffer> endRound() {
            List<ByteBuffer> chunks = round;
            round = new ArrayList<>();
            chunk = null;
            return chunks;
        }

        void giveBack(List<ByteBuffer> chunks) {
            free.addAll(chunks);
        }
    }

    private CQLSSTableWriter writer(int t) throws IOException {
        if (writers[t] == null) {
            JsonNode table = tables.get(t);
            Path dir = tableDir(t);
            Files.createDirectories(dir);
            writers[t] = CQLSSTableWriter.builder()
                    .inDirectory(dir.toString())
                    .forTable(table.get("create").asText())
                    .using(table.get("insert").asText())
                    .withPartitioner(FBUtilities.newPartitioner(cfg.get("partitioner").asText()))
                    .withBufferSizeInMiB(cfg.get("buffer_mib").asInt())
                    .build();
        }
        return writers[t];
    }

    private Path tableDir(int t) {
        String table = tables.get(t).get("name").asText();
        return scratch.resolve("r" + round).resolve(cfg.get("keyspace").asText()).resolve(table);
    }

    /** A round handed to the streaming thread: its writers (header order; null: no row of that table), their rows
     * and its folder. */
    private record Round(CQLSSTableWriter[] writers, long[] rows, Path dir, List<Path> tables, List<ByteBuffer> slab) {}

    /** Hand this round's writers over and start the next round: the streaming thread closes them (they sort and
     * write their SSTables) and streams them while the main thread takes the next rows. */
    private Round nextRound() {
        List<Path> written = new ArrayList<>();
        for (int t = 0; t < writers.length; t++) {
            if (writers[t] != null) written.add(tableDir(t));
        }
        Round handed = new Round(writers, pending, scratch.resolve("r" + round), written, slabs.endRound());
        writers = new CQLSSTableWriter[tables.size()];
        pending = new long[tables.size()];
        round++;
        return handed;
    }

    /** Close ROUND's writers (each sorts and writes its SSTables) and give its slab back: no row of the round is
     * held any more. Returns the round's rows. */
    private long closeWriters(Round handed) throws IOException {
        long rows = 0;
        for (int t = 0; t < handed.writers().length; t++) {
            if (handed.writers()[t] == null) continue;
            handed.writers()[t].close();
            rows += handed.rows()[t];
        }
        slabs.giveBack(handed.slab());
        return rows;
    }

    /** On the closing thread: close ROUND's writers (its SSTables written, its slab given back), then queue its
     * streaming; on a failure answer "ERROR" and exit, so that no later round is acknowledged after one that was
     * not. */
    private void closeThenStream(Round handed, PrintStream replies) {
        long t0 = System.nanoTime();
        try {
            long rows = closeWriters(handed);
            streamer.execute(() -> streamAndReply(handed, rows, t0, replies));
        } catch (Throwable t) {
            fail(t, replies);
        }
    }

    /** On the streaming thread: stream ROUND's tables in header order (data tables before metadata tables), remove
     * its files, answer "OK rows seconds" (since its closing started); on a failure answer "ERROR" and exit. */
    private void streamAndReply(Round handed, long rows, long t0, PrintStream replies) {
        try {
            for (Path dir : handed.tables()) {
                stream(dir);
            }
            deleteTree(handed.dir());
            replies.printf("OK %d %.3f%n", rows, (System.nanoTime() - t0) / 1e9);
        } catch (Throwable t) {
            fail(t, replies);
        }
    }

    private static synchronized void fail(Throwable t, PrintStream replies) {
        replies.println("ERROR " + describe(t));
        t.printStackTrace(System.err);
        System.exit(1);
    }

    /** Stream the SSTables of DIR (one table) to every replica of their ranges with sstableloader's own loader
     * (SSTableLoader), once more with a fresh view of the ring if the first try fails. */
    private void stream(Path dir) throws Exception {
        try {
            streamOnce(dir);
        } catch (IOException first) {
            System.err.println("imgest bulk: " + describe(first) + "; retrying once with a fresh view of the ring");
            client = null;
            Thread.sleep(1000);
            streamOnce(dir);
        }
    }

    private void streamOnce(Path dir) throws Exception {
        JsonNode l = cfg.get("loader");
        Set<InetAddressAndPort> ignore = new HashSet<>();
        for (JsonNode h : l.path("ignore")) {
            ignore.add(InetAddressAndPort.getByName(h.asText()));
        }
        if (client == null) { // a retry: the ring as the cluster has it now, read through the driver
            client = new RingOnce(externalClient(l), null, null);
        }
        SSTableLoader loader = new SSTableLoader(new File(dir.toString()), client, new OutputHandler.LogOutput(),
                l.get("connections_per_host").asInt(), null, null);
        StreamResultFuture future = loader.stream(ignore);
        try {
            future.get();
        } catch (ExecutionException e) {
            throw new IOException("streaming " + dir.getFileName() + " to " + loader.getFailedHosts() + " failed", e.getCause());
        }
        if (!loader.getFailedHosts().isEmpty()) {
            throw new IOException("streaming " + dir.getFileName() + " to " + loader.getFailedHosts() + " failed");
        }
    }

    /** The driver's Netty threads stop without the default 2 s quiet period (nothing is in flight at close). */
    static final NettyOptions QUICK_CLOSE = new NettyOptions() {
        @Override
        public void onClusterClose(EventLoopGroup group) {
            group.shutdownGracefully(0, 5, TimeUnit.SECONDS).syncUninterruptibly();
        }
    };

    /** sstableloader's client, reading the ring once per helper: its driver session takes seconds to close,
     * which every load would pay. */
    static final class RingOnce extends SSTableLoader.Client {
        private final NativeSSTableLoaderClient inner;
        private final JsonNode given; // the ring the job's driver read (header "loader"."ring"), or null
        private final String partitionerName;
        private boolean ready;

        RingOnce(NativeSSTableLoaderClient inner, JsonNode given, String partitionerName) {
            this.inner = inner;
            this.given = given == null || given.isNull() ? null : given;
            this.partitionerName = partitionerName;
        }

        /** The ring and the tables' ids as the job's driver read them, so that no helper opens a driver session of
         * its own (a second of CPU per helper, and the node's to answer it): each range's replicas' storage
         * endpoints, and each table's id, its columns from its CREATE statement (the one its SSTables were
         * written with). Without them (an older driver's header), or on a retry, NativeSSTableLoaderClient.init's
         * reading, through a driver that closes at once: its default Netty shutdown waits a 2 s quiet period,
         * which the first load of every helper paid. */
        @Override
        public synchronized void init(String keyspace) {
            if (ready) return;
            if (given != null) {
                fromHeader(keyspace);
                ready = true;
                return;
            }
            try {
                Cluster.Builder builder = Cluster.builder()
                        .addContactPointsWithPorts(this.<Collection<InetSocketAddress>>field("hosts"))
                        .allowBetaProtocolVersion()
                        .withNettyOptions(QUICK_CLOSE);
                SSLOptions ssl = field("sslOptions");
                AuthProvider auth = field("authProvider");
                if (ssl != null) builder.withSSL(ssl);
                if (auth != null) builder.withAuthProvider(auth);
                int storagePort = this.<Integer>field("storagePort");
                try (Cluster cluster = builder.build(); Session session = cluster.connect()) {
                    Metadata metadata = cluster.getMetadata();
                    IPartitioner partitioner = FBUtilities.newPartitioner(metadata.getPartitioner());
                    Token.TokenFactory tokens = partitioner.getTokenFactory();
                    for (TokenRange tr : metadata.getTokenRanges()) {
                        Range<Token> range = new Range<>(tokens.fromString(tr.getStart().getValue().toString()),
                                tokens.fromString(tr.getEnd().getValue().toString()));
                        for (Host host : metadata.getReplicas(Metadata.quote(keyspace), tr)) {
                            int port = host.getBroadcastSocketAddress().getPort();
                            addRangeForEndpoint(range, InetAddressAndPort.getByNameOverrideDefaults(
                                    host.getAddress().getHostAddress(), port != 0 ? port : storagePort));
                        }
                    }
                    Object types = fetch("fetchTypes", new Class<?>[] {String.class, Session.class}, keyspace, session);
                    Class<?>[] sig = {String.class, Session.class, IPartitioner.class, Types.class};
                    for (String what : new String[] {"fetchTables", "fetchViews"}) {
                        Map<?, ?> found = (Map<?, ?>) fetch(what, sig, keyspace, session, partitioner, types);
                        found.values().forEach(ref -> inner.setTableMetadata((TableMetadataRef) ref));
                    }
                }
            } catch (ReflectiveOperationException | IOException | RuntimeException e) {
                throw new RuntimeException("Unable to read the ring and the tables of " + keyspace, e);
            }
            ready = true;
        }

        private void fromHeader(String keyspace) {
            IPartitioner partitioner = FBUtilities.newPartitioner(partitionerName);
            Token.TokenFactory tokens = partitioner.getTokenFactory();
            int ranges = 0;
            for (JsonNode r : given.get("ranges")) {
                Range<Token> range = new Range<>(tokens.fromString(r.get(0).asText()), tokens.fromString(r.get(1).asText()));
                for (JsonNode endpoint : r.get(2)) {
                    try {
                        addRangeForEndpoint(range, InetAddressAndPort.getByName(endpoint.asText()));
                    } catch (java.net.UnknownHostException e) {
                        throw new RuntimeException("the header's ring names an unknown host " + endpoint.asText(), e);
                    }
                }
                ranges++;
            }
            for (JsonNode t : given.get("tables")) {
                TableMetadata table = CreateTableStatement.parse(t.get("create").asText(), keyspace)
                        .id(TableId.fromUUID(java.util.UUID.fromString(t.get("id").asText())))
                        .partitioner(partitioner)
                        .build();
                inner.setTableMetadata(TableMetadataRef.forOfflineTools(table));
            }
            System.err.println("imgest bulk: the ring from the header: " + ranges + " ranges, " + given.get("tables").size()
                    + " tables");
        }

        @SuppressWarnings("unchecked")
        private <T> T field(String name) throws ReflectiveOperationException {
            Field f = NativeSSTableLoaderClient.class.getDeclaredField(name);
            f.setAccessible(true);
            return (T) f.get(inner);
        }

        private static Object fetch(String name, Class<?>[] sig, Object... args) throws ReflectiveOperationException {
            Method m = NativeSSTableLoaderClient.class.getDeclaredMethod(name, sig);
            m.setAccessible(true);
            try {
                return m.invoke(null, args);
            } catch (InvocationTargetException e) {
                if (e.getCause() instanceof RuntimeException r) throw r;
                throw e;
            }
        }

        @Override
        public TableMetadataRef getTableMetadata(String table) {
            return inner.getTableMetadata(table);
        }

        @Override
        public StreamingChannel.Factory getConnectionFactory() {
            return inner.getConnectionFactory();
        }
    }

    private static NativeSSTableLoaderClient externalClient(JsonNode l) throws Exception {
        int nativePort = l.get("native_port").asInt();
        Set<InetSocketAddress> contacts = new HashSet<>();
        for (JsonNode h : l.get("hosts")) {
            contacts.add(new InetSocketAddress(InetAddress.getByName(h.asText()), nativePort));
        }
        AuthProvider auth = l.hasNonNull("user")
                ? new PlainTextAuthProvider(l.get("user").asText(), l.get("password").asText())
                : AuthProvider.NONE;
        SSLOptions ssl = l.hasNonNull("ca_pem") ? sslOptions(l) : null;
        return loaderClient(contacts, l.get("storage_port").asInt(), auth, ssl);
    }

    /** sstableloader's client (BulkLoader.ExternalClient: its streaming connections skip the server-side
     * preferred-IP lookup); the class is package-private, so it is built by reflection. */
    private static NativeSSTableLoaderClient loaderClient(
            Set<InetSocketAddress> contacts, int storagePort, AuthProvider auth, SSLOptions ssl) throws Exception {
        Constructor<?> make = Class.forName("org.apache.cassandra.tools.BulkLoader$ExternalClient").getConstructor(
                Set.class, int.class, AuthProvider.class, ServerEncryptionOptions.class, SSLOptions.class);
        make.setAccessible(true);
        return (NativeSSTableLoaderClient) make.newInstance(contacts, storagePort, auth, new ServerEncryptionOptions(), ssl);
    }

    /** TLS to the native port trusting the CA's PEM (the loader reads the ring through the driver). */
    /** TLS of the loader's header L: trust its ca_pem; with cert_pem and key_pem (PKCS#8), present that client
     * certificate (mutual TLS: a node with require_client_auth). */
    private static SSLOptions sslOptions(JsonNode l) throws Exception {
        CertificateFactory cf = CertificateFactory.getInstance("X.509");
        KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
        ks.load(null, null);
        int i = 0;
        for (Certificate c : certificates(cf, l.get("ca_pem").asText())) {
            ks.setCertificateEntry("ca" + i++, c);
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(ks);
        KeyManager[] keys = null;
        if (l.hasNonNull("cert_pem") && l.hasNonNull("key_pem")) {
            KeyStore own = KeyStore.getInstance("PKCS12");
            own.load(null, null);
            char[] none = new char[0];
            Certificate[] chain = certificates(cf, l.get("cert_pem").asText()).toArray(new Certificate[0]);
            own.setKeyEntry("client", privateKey(l.get("key_pem").asText(), chain[0]), none, chain);
            KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
            kmf.init(own, none);
            keys = kmf.getKeyManagers();
        }
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(keys, tmf.getTrustManagers(), null);
        return new RemoteEndpointAwareJdkSSLOptions(ctx, null) {
            /** The node's certificate must name the address it was reached at, as the Python driver checks it
             * (ssl.create_default_context); the address as given, never a reverse lookup of it. */
            @Override
            protected SSLEngine newSSLEngine(SocketChannel channel, InetSocketAddress remote) {
                SSLEngine engine = remote == null ? ctx.createSSLEngine()
                        : ctx.createSSLEngine(remote.getHostString(), remote.getPort());
                engine.setUseClientMode(true);
                SSLParameters params = engine.getSSLParameters();
                params.setEndpointIdentificationAlgorithm("HTTPS");
                engine.setSSLParameters(params);
                return engine;
            }
        };
    }

    private static java.util.Collection<? extends Certificate> certificates(CertificateFactory cf, String pem)
            throws Exception {
        return cf.generateCertificates(new ByteArrayInputStream(pem.getBytes(StandardCharsets.US_ASCII)));
    }

    /** The unencrypted PKCS#8 PEM key (imgest converts others before shipping), of the certificate's algorithm. */
    private static PrivateKey privateKey(String pem, Certificate cert) throws Exception {
        String body = pem.replaceAll("-----[A-Z ]+-----", "").replaceAll("\\s", "");
        byte[] der = java.util.Base64.getDecoder().decode(body);
        String algorithm = cert.getPublicKey().getAlgorithm();
        return KeyFactory.getInstance(algorithm).generatePrivate(new PKCS8EncodedKeySpec(der));
    }

    private static void deleteTree(Path root) throws IOException {
        if (!Files.exists(root)) return;
        try (var walk = Files.walk(root)) {
            for (Path p : walk.sorted(Comparator.reverseOrder()).toList()) {
                Files.delete(p);
            }
        }
    }
}
