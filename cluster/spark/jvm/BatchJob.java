package streamlab;

import java.io.BufferedOutputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.Serializable;
import java.nio.channels.Channels;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.UnaryOperator;

import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.arrow.vector.ipc.WriteChannel;
import org.apache.arrow.vector.ipc.message.IpcOption;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.python.PythonSQLUtils;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.execution.LogicalRDD;
import org.apache.spark.sql.execution.SQLExecution$;
import org.apache.spark.sql.execution.arrow.ArrowConverters$;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.ArrowUtils$;
import scala.collection.immutable.ArraySeq;
import scala.collection.immutable.Seq;
import scala.reflect.ClassTag$;
import scala.runtime.AbstractFunction0;
import scala.runtime.AbstractFunction1;
import scala.runtime.AbstractFunction2;

/**
 * A batch through a kept analysed plan as one Spark job, in one call: streamlab's
 * cluster/spark/plans.py calls {@link #run} through py4j for every batch of a chain whose
 * plan it keeps (BatchJobs.run).
 *
 * <p>The same steps in Python were some thirty py4j calls a batch: the Arrow file read into a
 * DataFrame, the kept plan copied over the batch's relation node by node, the job's Arrow served
 * over a socket of its own (three calls to learn its port, secret and server, one for the
 * result), and a call to release each Java object the batch reached. Each is a round trip into the
 * JVM, up to a millisecond on a TaskManager whose two cores are busy, paid by every batch however
 * few its rows. The job and its Arrow are PySpark's own (Dataset.toArrowBatchRdd, under a SQL
 * execution as collectAsArrowToPython runs it), written to a file the caller reads whole.
 *
 * <p>With a local master the tasks are threads of this JVM, and the batch's Arrow reaches them, and
 * theirs the driver, through the maps below instead of inside the tasks and their results: Spark
 * serialises a task with its partition (PySpark's way puts each input Arrow batch in one) and a
 * task's result with Java serialisation, a copy in blocks of 1 kB each way, which was a fifth of
 * the JVM's time on a stateless batch of a million rows. Another master takes PySpark's way.
 */
public final class BatchJob {
    private BatchJob() {}

    /** The input Arrow batches of the running local jobs, by job key. */
    private static final ConcurrentHashMap<String, byte[][]> INPUTS = new ConcurrentHashMap<>();
    /** The output Arrow batches of the running local jobs' partitions, by "key/partition". */
    private static final ConcurrentHashMap<String, byte[][]> OUTPUTS = new ConcurrentHashMap<>();
    private static final AtomicLong KEYS = new AtomicLong();

    /**
     * The rows of the Arrow stream file {@code in} (of the Spark schema {@code schemaJson}) through
     * {@code template}, an analysed plan that reads one input relation (a LogicalRDD, the batch's
     * place) besides constants, written to {@code out} as an Arrow stream, partitions in order.
     * Returns the nanoseconds taken to bind the plan to the batch (the rest of the call is the job
     * and its output).
     */
    public static long run(SparkSession session, LogicalPlan template, String schemaJson, String in, String out)
            throws IOException {
        long started = System.nanoTime();
        SQLConf conf = session.sessionState().conf();
        String timeZone = conf.sessionLocalTimeZone();
        boolean largeVarTypes = conf.arrowUseLargeVarTypes();
        boolean errorOnDuplicates = "legacy".equals(conf.pandasStructHandlingMode());
        String key = session.sparkContext().isLocal() ? Long.toString(KEYS.incrementAndGet()) : null;
        int outputs = 0;
        try {
            RDD<InternalRow> rdd;
            if (key == null) {
                Dataset<Row> batch = (Dataset<Row>) PythonSQLUtils.toDataFrame(
                    PythonSQLUtils.readArrowStreamFromFile(in), schemaJson, session);
                rdd = ((LogicalRDD) batch.logicalPlan()).rdd();
            } else {
                rdd = localRows(session, key, PythonSQLUtils.readArrowStreamFromFile(in),
                                (StructType) DataType.fromJson(schemaJson), timeZone, largeVarTypes);
            }
            LogicalPlan plan = over(template, leaf -> readingRdd(leaf, rdd));
            plan.setAnalyzed();
            Dataset<Row> result = Dataset.ofRows(session, plan);
            long bound = System.nanoTime();

            RDD<byte[]> arrow = result.toArrowBatchRdd(
                conf.arrowMaxRecordsPerBatch(), timeZone, errorOnDuplicates, largeVarTypes);
            outputs = arrow.partitions().length;
            byte[][] batches = SQLExecution$.MODULE$.withNewExecutionId(
                result.queryExecution(), scala.Option.apply("streamlab batch"), new AbstractFunction0<byte[][]>() {
                    @Override
                    public byte[][] apply() {
                        return key == null ? (byte[][]) arrow.collect() : localOutput(session, arrow, key);
                    }
                });
            writeStream(out, result.schema(), timeZone, errorOnDuplicates, largeVarTypes,
                        scala.jdk.javaapi.CollectionConverters.asScala(java.util.Arrays.asList(batches).iterator()));
            return bound - started;
        } finally {
            if (key != null) {
                INPUTS.remove(key);
                for (int p = 0; p < outputs; p++) {
                    OUTPUTS.remove(key + "/" + p);  // a failed job's partitions that did finish
                }
            }
        }
    }

    /** The local jobs' batches held now: none between jobs, whether they succeeded or failed. */
    public static int held() {
        return INPUTS.size() + OUTPUTS.size();
    }

    /** The batches as rows, one partition per Arrow batch in order, as PySpark's toDataFrame makes
     * them, but the tasks carry the key and their batch's index, not the batch. */
    private static RDD<InternalRow> localRows(SparkSession session, String key, scala.collection.Iterator<byte[]> in,
                                              StructType schema, String timeZone, boolean largeVarTypes) {
        byte[][] batches = (byte[][]) in.toArray(ClassTag$.MODULE$.apply(byte[].class));
        INPUTS.put(key, batches);
        List<Integer> indices = new ArrayList<>();
        for (int i = 0; i < batches.length; i++) {
            indices.add(i);
        }
        // one slice per index (ParallelCollectionRDD slices evenly, in order); at least one partition
        RDD<Integer> slices = JavaSparkContext.fromSparkContext(session.sparkContext())
            .parallelize(indices, Math.max(1, indices.size())).rdd();
        return slices.mapPartitions(new InputRows(key, schema, timeZone, largeVarTypes), true,
                                    ClassTag$.MODULE$.apply(InternalRow.class));
    }

    /** A task's input batches, taken from INPUTS in the driver's JVM, as rows. */
    private static final class InputRows
            extends AbstractFunction1<scala.collection.Iterator<Integer>, scala.collection.Iterator<InternalRow>>
            implements Serializable {
        private final String key;
        private final StructType schema;
        private final String timeZone;
        private final boolean largeVarTypes;

        InputRows(String key, StructType schema, String timeZone, boolean largeVarTypes) {
            this.key = key;
            this.schema = schema;
            this.timeZone = timeZone;
            this.largeVarTypes = largeVarTypes;
        }

        @Override
        public scala.collection.Iterator<InternalRow> apply(scala.collection.Iterator<Integer> indices) {
            byte[][] all = INPUTS.get(key);
            if (all == null) {
                throw new IllegalStateException("streamlab batch " + key + ": its input is gone (not a local task?)");
            }
            List<byte[]> mine = new ArrayList<>();
            while (indices.hasNext()) {
                mine.add(all[indices.next()]);
            }
            return ArrowConverters$.MODULE$.fromBatchIterator(
                scala.jdk.javaapi.CollectionConverters.asScala(mine.iterator()), schema, timeZone, false,
                largeVarTypes, TaskContext.get());
        }
    }

    /** The job's Arrow batches, partitions in order: each task leaves its own in OUTPUTS. */
    private static byte[][] localOutput(SparkSession session, RDD<byte[]> arrow, String key) {
        session.sparkContext().runJob(arrow, new OutputBatches(key), ClassTag$.MODULE$.Int());
        List<byte[]> all = new ArrayList<>();
        for (int p = 0; p < arrow.partitions().length; p++) {
            byte[][] part = OUTPUTS.remove(key + "/" + p);
            if (part == null) {
                throw new IllegalStateException("streamlab batch " + key + ": partition " + p + " left no output");
            }
            all.addAll(java.util.Arrays.asList(part));
        }
        return all.toArray(new byte[0][]);
    }

    private static final class OutputBatches
            extends AbstractFunction2<TaskContext, scala.collection.Iterator<byte[]>, Object>
            implements Serializable {
        private final String key;

        OutputBatches(String key) {
            this.key = key;
        }

        @Override
        public Object apply(TaskContext context, scala.collection.Iterator<byte[]> batches) {
            byte[][] mine = (byte[][]) batches.toArray(ClassTag$.MODULE$.apply(byte[].class));
            OUTPUTS.put(key + "/" + context.partitionId(), mine);
            return mine.length;
        }
    }

    /**
     * The plan with its LogicalRDD leaf (there is one) replaced by {@code leaf} of it, the nodes
     * above rebuilt: the one way the helpers put a kept plan over a batch (LocalBatch too; without
     * the helpers, catalyst.PlanCopier in Python).
     */
    static LogicalPlan over(LogicalPlan node, UnaryOperator<LogicalPlan> leaf) {
        if (node instanceof LogicalRDD) {
            return leaf.apply(node);
        }
        Seq<LogicalPlan> children = node.children();
        if (children.isEmpty()) {
            return node;
        }
        LogicalPlan[] kids = new LogicalPlan[children.size()];
        boolean changed = false;
        for (int i = 0; i < kids.length; i++) {
            LogicalPlan child = children.apply(i);
            kids[i] = over(child, leaf);
            changed |= kids[i] != child;
        }
        return changed ? node.withNewChildren(seq(kids)) : node;
    }

    /** A copy of the input leaf that reads {@code rdd}: it keeps the leaf's attribute ids, which
     * every expression above refers to. */
    private static LogicalPlan readingRdd(LogicalPlan leaf, RDD<InternalRow> rdd) {
        Object[] args = new Object[leaf.productArity()];
        for (int i = 0; i < args.length; i++) {
            args[i] = "rdd".equals(leaf.productElementName(i)) ? rdd : leaf.productElement(i);
        }
        return leaf.makeCopy(args);
    }

    /** Arrow IPC messages of ArrowConverters (one encapsulated record batch each) as a stream file. */
    static void writeStream(String path, StructType schema, String timeZone, boolean errorOnDuplicates,
                            boolean largeVarTypes, scala.collection.Iterator<byte[]> batches) throws IOException {
        try (OutputStream file = new BufferedOutputStream(new FileOutputStream(path), 1 << 16)) {
            WriteChannel channel = new WriteChannel(Channels.newChannel(file));
            MessageSerializer.serialize(channel, ArrowUtils$.MODULE$.toArrowSchema(
                schema, timeZone, errorOnDuplicates, largeVarTypes, ArrowUtils$.MODULE$.toArrowSchema$default$5()));
            while (batches.hasNext()) {
                channel.write(batches.next());
            }
            ArrowStreamWriter.writeEndOfStream(channel, IpcOption.DEFAULT);
        }
    }

    @SuppressWarnings("unchecked")
    static <T> Seq<T> seq(T[] items) {
        return (Seq<T>) (Object) ArraySeq.unsafeWrapArray(items);
    }
}
