// Samples a JVM's memory over local JMX and prints one JSON line per sample to stdout:
// {"t": ms since start, "heap": used bytes, "heap_max": bytes, "direct": bytes in direct buffers, "direct_max": limit,
//  "mapped": bytes in mapped buffers, "sstables": {"ks.table": live SSTables}}. Run with the source launcher:
// java NodeMemory.java HOST:PORT INTERVAL_MS [KS.TABLE ...]
// (imgest.bench.node_memory starts it beside a benchmark and keeps the peaks). Stops when stdin closes.
import java.lang.management.MemoryUsage;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.openmbean.CompositeData;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

public class NodeMemory {
    public static void main(String[] args) throws Exception {
        String url = "service:jmx:rmi:///jndi/rmi://" + args[0] + "/jmxrmi";
        long interval = Long.parseLong(args[1]);
        Thread watcher = new Thread(() -> {
            try {
                while (System.in.read() >= 0) { }
            } catch (Exception e) { }
            System.exit(0);
        });
        watcher.setDaemon(true);
        watcher.start();
        long start = System.currentTimeMillis();
        JMXConnector connector = null;
        while (true) {
            try {
                if (connector == null) connector = JMXConnectorFactory.connect(new JMXServiceURL(url));
                MBeanServerConnection mbs = connector.getMBeanServerConnection();
                MemoryUsage heap = MemoryUsage.from(
                    (CompositeData) mbs.getAttribute(new ObjectName("java.lang:type=Memory"), "HeapMemoryUsage"));
                long direct = (Long) mbs.getAttribute(new ObjectName("java.nio:type=BufferPool,name=direct"), "MemoryUsed");
                long mapped = (Long) mbs.getAttribute(new ObjectName("java.nio:type=BufferPool,name=mapped"), "MemoryUsed");
                StringBuilder tables = new StringBuilder();
                for (int i = 2; i < args.length; i++) {
                    String[] kt = args[i].split("\\.", 2);
                    Object count;
                    try {
                        count = mbs.getAttribute(new ObjectName("org.apache.cassandra.metrics:type=Table,keyspace="
                            + kt[0] + ",scope=" + kt[1] + ",name=LiveSSTableCount"), "Value");
                    } catch (javax.management.InstanceNotFoundException e) {
                        count = "null";  // no such table (yet)
                    }
                    tables.append(tables.length() == 0 ? "" : ", ").append("\"").append(args[i]).append("\": ").append(count);
                }
                System.out.println("{\"t\": " + (System.currentTimeMillis() - start) + ", \"heap\": " + heap.getUsed()
                    + ", \"heap_max\": " + heap.getMax() + ", \"direct\": " + direct + ", \"mapped\": " + mapped
                    + ", \"sstables\": {" + tables + "}}");
            } catch (Exception e) {
                System.out.println("{\"t\": " + (System.currentTimeMillis() - start) + ", \"error\": \""
                    + e.getClass().getSimpleName() + "\"}");
                if (connector != null) {
                    try { connector.close(); } catch (Exception ignored) { }
                }
                connector = null;
            }
            System.out.flush();
            Thread.sleep(interval);
        }
    }
}
